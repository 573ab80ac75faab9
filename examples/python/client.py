#!/usr/bin/python3
"""Streams one completion from a running `troupe serve` over its ZeroMQ plane.

Uses Debian's python3-zmq and python3-msgpack (run with /usr/bin/python3). The protocol is in
docs/protocol.md: one msgpack map per frame on a DEALER socket, replies are delta maps until one
carries finish_reason, or a single error map.
"""
import argparse
import sys
import uuid

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

# A request whose connection closes is never answered: a peer that is not a troupe door (an HTTP
# server answers ZeroMQ's greeting with "HTTP/1.1 400", which libzmq takes for an old ZMTP peer),
# or a server that went away. Watching these events ends the wait at once instead of at the
# request timeout.
CONNECTION_LOST = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                   zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:5557")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--connect-timeout", type=float, default=5.0,
                        help="seconds to wait for a connection to the server")
    parser.add_argument("--request-timeout", "--timeout", dest="timeout", type=float, default=60.0,
                        help="seconds to wait for each reply")
    args = parser.parse_args()

    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    # ZeroMQ connects in the background: messages go only to a connection that is up, and a send
    # waits for one at most the connect timeout, so an endpoint nobody answers at is an error.
    socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.setsockopt(zmq.SNDTIMEO, int(args.connect_timeout * 1000))
    events = socket.get_monitor_socket(CONNECTION_LOST)
    socket.connect(args.endpoint)
    request = {
        "type": "generate",
        "id": uuid.uuid4().hex,
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
    }
    if args.api_key:
        request["api_key"] = args.api_key
    try:
        while events.poll(0):  # only a loss after the request counts against it
            recv_monitor_message(events)
        socket.send(msgpack.packb(request))
    except zmq.Again:
        sys.exit("cannot reach a server at %s: no connection within %.0f s (is `troupe serve` running there?)"
                 % (args.endpoint, args.connect_timeout))

    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(events, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(int(args.timeout * 1000)))
        if not ready:
            sys.exit("no reply from %s within %.0f s" % (args.endpoint, args.timeout))
        if socket not in ready:
            event = recv_monitor_message(events)["event"]
            what = "the connection closed" if event == zmq.EVENT_DISCONNECTED else "the ZeroMQ handshake failed"
            sys.exit("%s with %s before the request was answered: is a troupe ZeroMQ door listening there "
                     "(not its HTTP port)?" % (what, args.endpoint))
        reply = msgpack.unpackb(socket.recv(), raw=False)
        if reply.get("id") != request["id"]:
            continue
        if reply["type"] == "error":
            sys.exit("error %s: %s" % (reply["code"], reply["message"]))
        sys.stdout.write(reply["text"])
        sys.stdout.flush()
        if "finish_reason" in reply:
            usage, timings = reply["usage"], reply["timings"]
            sys.stdout.write("\n")
            sys.stderr.write("finish %s, %d prompt + %d completion tokens, ttft %.2f ms, e2e %.2f ms\n" % (
                reply["finish_reason"], usage["prompt_tokens"], usage["completion_tokens"],
                timings["ttft"] * 1e3, timings["e2e"] * 1e3))
            return


if __name__ == "__main__":
    main()
