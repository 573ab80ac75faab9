#pragma once
// A guard against a CAF 0.17 bug that drops healthy TLS connections.
//
// CAF's OpenSSL session decides whether a connection failed with SSL_get_error, but never empties
// the thread's OpenSSL error queue (the line that would read it is commented out in CAF). OpenSSL
// requires that queue to be empty before each TLS I/O call, else SSL_get_error may report the
// error another connection left there. With OpenSSL 3, a peer that vanishes (kill -9) leaves an
// "unexpected EOF" error; the next read on any other connection of the multiplexer thread that
// merely has no data yet is then taken as fatal and CAF closes it: killing one node dropped the
// controller's connections to every other node.
//
// node/openssl_error_queue.cpp defines SSL_read, SSL_write, SSL_connect, SSL_accept and
// SSL_do_handshake in the program itself; the dynamic linker binds CAF's calls to them first
// (symbol interposition), and each empties the queue, then calls OpenSSL's own.

namespace troupe {

// Does nothing at run time: calling it (node.cpp, remote_node.cpp do) links the wrappers into
// every program that uses the middleman, tests included.
void keep_openssl_error_queue_clean();

}  // namespace troupe
