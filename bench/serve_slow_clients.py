"""Slow clients against a running ``onnxcast serve`` on loopback (issue 18, item 8).

Measures, against the server at ``--url``:

1. a lone client's latency (p50, p99 over ``--requests`` sequential keep-alive requests),
2. the same with one connection that sent headers and part of a body and then stalls,
3. how many of ``--stalled`` stalled sockets (idle, half headers, half body; a third each)
   the server still holds open after ``--wait`` seconds.

    python bench/serve_slow_clients.py --url http://127.0.0.1:8080 --model m --shape 1,16,2 [--token-env VAR]

Only the standard library: it runs against any version of the server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import socket
import statistics
import time
from urllib.parse import urlsplit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="m")
    parser.add_argument("--shape", default="1,16,2", help="history shape batch,time,features")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--stalled", type=int, default=60)
    parser.add_argument("--wait", type=float, default=34.0)
    parser.add_argument("--token-env", help="environment variable holding the bearer token, if any")
    args = parser.parse_args()
    parts = urlsplit(args.url)
    headers = {"Content-Type": "application/json"}
    if args.token_env:
        headers["Authorization"] = f"Bearer {os.environ[args.token_env]}"
    batch, steps, features = (int(x) for x in args.shape.split(","))
    body = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": [batch, steps, features],
                                   "data": [1.0] * (batch * steps * features)}]}).encode()
    path = f"/v2/models/{args.model}/infer"

    def lone_client() -> tuple[float, float]:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        times = []
        for _ in range(args.requests):
            started = time.perf_counter()
            connection.request("POST", path, body, headers)
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
            times.append((time.perf_counter() - started) * 1000)
        connection.close()
        times.sort()
        return statistics.median(times), times[int(len(times) * 0.99) - 1]

    p50, p99 = lone_client()
    print(f"lone client, nothing else open: p50 {p50:.2f} ms, p99 {p99:.2f} ms ({args.requests} requests)")
    stalled = socket.create_connection((parts.hostname, parts.port))
    stalled.sendall(f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
    time.sleep(0.2)
    p50, p99 = lone_client()
    print(f"lone client, one stalled partial body open: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    stalled.close()

    sockets = []
    for kind in range(args.stalled):
        sock = socket.create_connection((parts.hostname, parts.port))
        if kind % 3 == 1:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Le".encode())
        elif kind % 3 == 2:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: 100\r\n\r\n{{".encode())
        sockets.append(sock)
    started = time.monotonic()
    open_ = set(sockets)
    while open_ and time.monotonic() - started < args.wait:
        for sock in select.select(list(open_), [], [], 0.5)[0]:
            try:
                if not sock.recv(65536):
                    open_.discard(sock)
            except ConnectionError:
                open_.discard(sock)
    print(f"stalled sockets still open after {time.monotonic() - started:.0f} s: {len(open_)} of {args.stalled}")
    for sock in sockets:
        sock.close()


if __name__ == "__main__":
    main()
