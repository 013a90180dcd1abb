"""The plans the power-cut trials run (tests/crashharness.py): the demo's shape (shell steps
with findings, a fan-out and a join, `when` and env read from findings) and the rehearsal's
(a real HTTP server launched, benchmarked, stopped, a second one, the analysis, a step after
it), on tests/openai_stub.py. Each step that starts a process writes `start ID` to the
witness first: what the outside world saw begin."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from crashharness import Trial

STUB = Path(__file__).resolve().parent / "openai_stub.py"

DEMO = """name: crash
tasks:
  - id: prepare
    kind: shell
    params: {command: "echo start $ORCH_TASK >> {witness}; echo ::finding workdir=scratch"}
  - id: write_data
    kind: shell
    needs: [prepare]
    params:
      command: |
        echo start $ORCH_TASK >> {witness}; sleep 0.05
        echo '::finding size=4096 unit=bytes'
  - id: checksum
    kind: shell
    needs: [write_data]
    retries: {attempts: 2, delay: 0.1s}
    params: {command: "echo start $ORCH_TASK >> {witness}; echo ::finding sum=abc"}
  - id: measure
    kind: shell
    needs: [write_data]
    params:
      command: |
        echo start $ORCH_TASK >> {witness}; sleep 0.05
        echo '::finding read_mb_s=900 unit=MB/s'
  - id: report
    kind: shell
    needs: [checksum, measure]
    when: "${tasks.write_data.findings.size} > 0"
    params:
      command: "echo start $ORCH_TASK >> {witness}; echo \\"$SIZE $READ\\"; echo ::finding said=1"
      env: {SIZE: "${tasks.write_data.findings.size}", READ: "${tasks.measure.findings.read_mb_s}"}
"""
DEMO_NEEDS = {"write_data": ["prepare"], "checksum": ["write_data"], "measure": ["write_data"],
              "report": ["checksum", "measure"]}  # fmt: skip
DEMO_KEYS = {"prepare": ["workdir"], "write_data": ["size"], "checksum": ["sum"],
             "measure": ["read_mb_s"], "report": ["said"]}  # fmt: skip


def _launch(task: str, needs: str, port: int) -> str:
    serve = f"echo start {task} >> {{witness}}; exec {sys.executable} {STUB} {port} --child"
    return f"""
  - id: {task}
    kind: server.launch
    needs: [{needs}]
    params:
      flavour: command
      command: [sh, -c, "{serve}"]
      port: {port}
      ready_timeout: 30s
      stop_timeout: 5s"""


def _bench(task: str, server: str) -> str:
    return f"""
  - id: {task}
    kind: bench.serve
    needs: [{server}]
    params: {{server: {server}, concurrency: [1, 2], requests: 4, warmup: 0, output_tokens: 8,
             input_words: 4, min_windows: 1, max_windows: 2}}"""


def _stop(task: str, server: str) -> str:
    return f"""
  - id: {task}
    kind: server.stop
    needs: [bench_{server.removeprefix("launch_")}]
    params: {{server: {server}}}"""


def rehearsal(ports: tuple[int, int]) -> str:
    return (
        """name: crash
tasks:
  - id: prepare
    kind: shell
    params: {command: "echo start $ORCH_TASK >> {witness}; echo ::finding ready=1"}"""
        + _launch("launch_base", "prepare", ports[0])
        + _bench("bench_base", "launch_base")
        + _stop("stop_base", "launch_base")
        + _launch("launch_cand", "stop_base", ports[1])
        + _bench("bench_cand", "launch_cand")
        + _stop("stop_cand", "launch_cand")
        + """
  - id: analyze
    kind: analyze.compare
    needs: [bench_base, bench_cand]
    params:
      baseline: ${tasks.bench_base.findings.result}
      candidates:
        cand: ${tasks.bench_cand.findings.result}
  - id: decide
    kind: shell
    needs: [analyze]
    params: {command: "echo start $ORCH_TASK >> {witness}; echo ::finding decided=1"}
"""
    )


REHEARSAL_NEEDS = {"launch_base": ["prepare"], "launch_cand": ["stop_base"],
                   "decide": ["analyze"]}  # fmt: skip
REHEARSAL_KEYS = {"prepare": ["ready"], "launch_base": ["url"], "bench_base": ["result"],
                  "launch_cand": ["url"], "bench_cand": ["result"], "analyze": ["cand.verdict"],
                  "decide": ["decided"]}  # fmt: skip


def free_ports(n: int) -> tuple[int, ...]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def demo_trial(work: Path) -> Trial:
    return Trial(work, DEMO, DEMO_NEEDS, DEMO_KEYS)


def rehearsal_trial(work: Path) -> Trial:
    a, b = free_ports(2)
    return Trial(work, rehearsal((a, b)), REHEARSAL_NEEDS, REHEARSAL_KEYS)
