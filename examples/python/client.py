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
        socket.send(msgpack.packb(request))
    except zmq.Again:
        sys.exit("cannot reach a server at %s: no connection within %.0f s (is `troupe serve` running there?)"
                 % (args.endpoint, args.connect_timeout))

    while True:
        if not socket.poll(int(args.timeout * 1000)):
            sys.exit("no reply from %s within %.0f s" % (args.endpoint, args.timeout))
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
