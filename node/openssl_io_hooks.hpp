#pragma once
// Hooks around the OpenSSL calls CAF's OpenSSL module makes, for two things CAF 0.17 does not do.
//
// 1. Keep healthy connections alive. CAF's OpenSSL session decides whether a connection failed
//    with SSL_get_error, but never empties the thread's OpenSSL error queue (the line that would
//    read it is commented out in CAF). OpenSSL requires that queue to be empty before each TLS
//    I/O call, else SSL_get_error may report the error another connection left there. With
//    OpenSSL 3, a peer that vanishes (kill -9) leaves an "unexpected EOF" error; the next read on
//    any other connection of the multiplexer thread that merely has no data yet is then taken as
//    fatal and CAF closes it: killing one node dropped the controller's connections to every
//    other node. Each hook empties the queue first.
// 2. Log refused peers. CAF tells nobody of a failed TLS handshake, so a peer without the
//    cluster's credentials would be refused silently. A handshake that fails is logged, once per
//    connection, as `TLS handshake with HOST:PORT refused: REASON` (OpenSSL's reason, e.g.
//    "certificate verify failed" or "tlsv1 alert unknown ca").
//
// node/openssl_io_hooks.cpp defines SSL_read, SSL_write, SSL_connect, SSL_accept and
// SSL_do_handshake in the program itself; the dynamic linker binds CAF's calls to them first
// (symbol interposition), and each calls OpenSSL's own.

namespace troupe {

// Does nothing at run time: calling it (node.cpp, remote_node.cpp, the admin client do) links
// the hooks into every program that uses the middleman, tests included.
void keep_openssl_error_queue_clean();

}  // namespace troupe
