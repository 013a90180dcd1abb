"""A small OpenAI-compatible server for fast tests: a real process, real HTTP, real streaming.

    python openai_stub.py PORT [--load SECONDS] [--die-after SECONDS] [--child] [--burst]
                          [--short N] [--drift] [--fail-streams I,J,...]

It answers /health, /v1/models, /tokenize (a token per word), /v1/completions (streamed: one
token per chunk, with `usage` last; a prompt of words or token ids) and /metrics with
vLLM-named spec-decode counters that move by a rule a test can predict: every request of n
output tokens adds n//2 drafts of 3 tokens, n//2 of them accepted, so tau = 2.0, k = 3,
acceptance 1/3. `--load` waits before listening (a model
loading), `--die-after` exits 3 while loading, `--child` forks a process that stays in the
group (vLLM's EngineCore), so a stop that ends only the main process is caught. Measurement
artifacts on demand: `--burst` holds an answer's chunks back and writes them in one go (what a
starved vLLM API server does), `--short N` answers at most N tokens whatever was asked,
`--drift` makes every request slower than the one before (throughput never settles),
`--fail-streams 2,5` answers HTTP 500 to the 2nd and 5th streamed request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "requests": 0, "streams": 0}
LOCK = threading.Lock()
ARGS = argparse.Namespace()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()  # no Nagle: each token leaves at once, as uvicorn's do
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, b"")
        elif self.path == "/v1/models":
            self.reply(
                200,
                json.dumps(
                    {
                        "object": "list",
                        "data": [{"id": "stub", "object": "model", "max_model_len": 4096}],
                    }
                ).encode(),
            )
        elif self.path == "/version" and ARGS.version:  # as vLLM answers it
            self.reply(200, json.dumps({"version": ARGS.version}).encode())
        elif self.path == "/metrics":
            with LOCK:
                c = dict(COUNTS)
            lines = [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="stub"}} {c["drafts"]}',
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="stub"}} '
                f"{c['draft_tokens']}",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="stub"}} '
                f"{c['accepted']}",
                "# TYPE stub_requests counter",
                f"stub_requests_total {c['requests']}",
            ]
            self.reply(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")
        else:
            self.reply(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path == "/tokenize":  # one token per word, as vLLM's shape has it
            tokens = [100 + len(word) for word in body["prompt"].split()]
            return self.reply(
                200,
                json.dumps(
                    {"count": len(tokens), "max_model_len": 4096, "tokens": tokens}
                ).encode(),
            )
        if self.path != "/v1/completions":
            return self.reply(404, b'{"error": "not found"}')
        if body.get("stream"):
            with LOCK:
                COUNTS["streams"] += 1
                fail = str(COUNTS["streams"]) in ARGS.fail_streams.split(",")
            if fail:
                return self.reply(500, b'{"error": "injected failure"}')
        n = min(int(body.get("max_tokens", 16)), ARGS.short or 1 << 30)
        prompt = body.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        with LOCK:
            COUNTS["requests"] += 1
            # Steep enough that a loaded host's scheduling noise cannot hide it.
            delay = 0.003 * (1 + COUNTS["requests"] / 2) if ARGS.drift else 0.002
            COUNTS["drafts"] += n // 2
            COUNTS["draft_tokens"] += 3 * (n // 2)
            COUNTS["accepted"] += n // 2
        if not body.get("stream"):
            return self.reply(
                200,
                json.dumps(
                    {
                        "choices": [{"text": "tok " * n}],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n},
                    }
                ).encode(),
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        held: list[bytes] = []

        def send(obj: object) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            held.append(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            if not ARGS.burst:
                self.wfile.write(held.pop())
                self.wfile.flush()

        for _ in range(n):
            time.sleep(delay)
            send({"choices": [{"index": 0, "text": "tok "}]})
        send({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n}})
        send("[DONE]")
        self.wfile.write(b"".join(held) + b"0\r\n\r\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--load", type=float, default=0.0)
    ap.add_argument("--die-after", type=float, default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--burst", action="store_true")
    ap.add_argument("--short", type=int, default=0)
    ap.add_argument("--drift", action="store_true")
    ap.add_argument("--fail-streams", default="")
    ap.add_argument("--ignore-term-loading", action="store_true")  # as vLLM may while loading
    ap.add_argument("--version", default=None)  # answer /version, as vLLM does
    args = ap.parse_args(namespace=ARGS)
    if args.ignore_term_loading:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child and os.fork() == 0:  # stays in our process group, like EngineCore
        os.execvp("sleep", ["sleep", "600"])
    print(f"stub: loading for {args.load}s", flush=True)
    if args.die_after is not None and args.die_after <= args.load:
        time.sleep(args.die_after)
        print("stub: out of memory while loading weights", flush=True)
        sys.exit(3)
    time.sleep(args.load)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"stub: serving on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
