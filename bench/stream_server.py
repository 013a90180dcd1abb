"""A synthetic OpenAI-compatible streaming server whose timing is known: the ruler that
bench.serve's load generator is measured against (bench/bench_loadgen_ceiling.py).

    python bench/stream_server.py PORT [--procs 4] [--interval-ms 10] [--cpus 4,5,6]

`--procs` processes share the port (SO_REUSEPORT: the kernel spreads the connections), each
one asyncio loop on raw streams (no web framework: its own CPU must stay far below the
client's). POST /v1/completions with `stream: true` answers `max_tokens` tokens, token i
written at start + i x interval: a fixed schedule, so a late write does not shift the next
ones, and every stream's true TPOT is exactly the interval. /health and /v1/models answer too.
`--cpus` keeps every process on those CPUs (off the client's, whose ceiling is measured).
Each process writes how late its writes were to stderr when it ends (SIGTERM): a server that
fell behind its schedule is no ruler, and the bench checks it did not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time

LATE: list[float] = []  # this process's token writes, seconds past their due time


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next(
                (
                    int(v)
                    for k, _, v in (h.partition(":") for h in lines[1:])
                    if k.lower() == "content-length"
                ),
                0,
            )
            body = json.loads(await reader.readexactly(length)) if length else {}
            if method == "POST" and path == "/v1/completions" and body.get("stream"):
                await stream(writer, body)
            elif path in ("/health", "/v1/models"):
                reply = b'{"data": [{"id": "tiny"}]}' if path == "/v1/models" else b"{}"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(reply)}\r\n\r\n".encode()
                    + reply
                )
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def stream(writer: asyncio.StreamWriter, body: dict[str, object]) -> None:
    n = int(body.get("max_tokens", 16))  # type: ignore[call-overload]
    prompt = str(body.get("prompt", ""))
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )

    def chunk(obj: object) -> bytes:
        data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    token = chunk({"choices": [{"index": 0, "text": "tok "}]})
    start = time.perf_counter()
    for i in range(n):
        due = start + i * INTERVAL
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        LATE.append(max(0.0, time.perf_counter() - due))
        writer.write(token)
        await writer.drain()
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n}
    writer.write(chunk({"choices": [], "usage": usage}) + chunk("[DONE]") + b"0\r\n\r\n")


async def serve(sock: socket.socket, children: list[int]) -> None:
    server = await asyncio.start_server(handle, sock=sock, backlog=4096)
    stop = asyncio.Event()

    def end() -> None:
        for child in children:  # the first process ends the others
            os.kill(child, signal.SIGTERM)
        stop.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, end)
    async with server:
        await stop.wait()
    late = sorted(LATE) or [0.0]
    p99 = late[min(len(late) - 1, int(0.99 * len(late)))]
    print(
        json.dumps({"pid": os.getpid(), "tokens": len(LATE), "late_p99_ms": p99 * 1000}),
        file=sys.stderr,
        flush=True,
    )


def listener(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    return sock


INTERVAL = 0.01


def main() -> None:
    global INTERVAL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--cpus", default=None, help="comma-separated CPU ids")
    args = ap.parse_args()
    INTERVAL = args.interval_ms / 1000
    if args.cpus:  # before the forks: every process inherits it
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    children = []
    for _ in range(args.procs - 1):
        pid = os.fork()
        if pid == 0:
            asyncio.run(serve(listener(args.port), []))
            os._exit(0)
        children.append(pid)
    asyncio.run(serve(listener(args.port), children))
    for child in children:
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
