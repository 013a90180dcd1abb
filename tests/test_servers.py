"""server.launch / server.stop / bench.serve / process.stop through `orch run`, against a real
HTTP server process (tests/openai_stub.py): fast, exact counters, every lifecycle path. The
same kinds against a real vLLM are in test_vllm.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Context
from orchestrator.proc.containment import jail
from orchestrator.proc.procfs import marked
from probes.procs import listeners
from tasks.benchmark.acceptance import measured, of_window, unmeasured_acceptance
from tasks.benchmark.params import Outcome, Target
from tasks.benchmark.windows import stats_ms, summarize_level
from tasks.serving.engines import ENGINES, identify
from tasks.serving.engines.base import Stream
from tasks.serving.launch import LaunchParams, ServerLaunch, render

from conftest import PlanDir, free_port, pid_alive, run_orch, start_orch, wait_for
from sglang_shapes import GENERATE_FINAL_CHUNK

STUB = str(Path(__file__).with_name("openai_stub.py"))


def marker_of(pid: int, name: str) -> tuple[str, str]:
    """The (NAME, VALUE) of an environment marker that process `pid` carries."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (value,) = [v.partition(b"=")[2] for v in env if v.startswith(f"{name}=".encode())]
    return name, value.decode()


def marked_processes(within: Path, prefix: str = "ORCH_SERVER=") -> list[int]:
    """Live processes carrying server.launch's environment marker, started in `within`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            if not Path(os.readlink(f"/proc/{entry}/cwd")).is_relative_to(within):
                continue
        except OSError:
            continue
        if prefix.encode() in env and pid_alive(int(entry)):
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_server_left(tmp_path: Path) -> object:
    yield
    left = marked_processes(tmp_path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"server processes left running: {left}"


def stub_plan(
    port: int, extra: str = "", stub_args: str = "--child", command: str | None = None
) -> str:
    """A plan launching the stub (or `command`, a YAML list), then the `extra` tasks."""
    command = command or f'[{sys.executable}, {STUB}, "{port}", {", ".join(stub_args.split())}]'
    return f"""
    name: t
    tasks:
      - id: launch
        kind: server.launch
        params:
          flavour: command
          command: {command}
          port: {port}
          ready_timeout: 30s
          progress_every: 0.5s
          stop_timeout: 5s
    {extra}
    """


def findings(plan: Path, task: str) -> dict[str, object]:
    """A task's findings as `orch status --json` shows them."""
    doc = json.loads(run_orch("status", plan, "--json").stdout)
    (row,) = [t for t in doc["tasks"] if t["id"] == task]
    return {f["key"]: f["value"] for f in row["findings"]}


# --- rendering the engines' command lines ---------------------------------------------------------


def test_vllm_command_line_carries_speculative_config_and_admission() -> None:
    p = LaunchParams.model_validate(
        {
            "flavour": "vllm",
            "model": "/m/target",
            "port": 8000,
            "tensor_parallel": 8,
            "max_running_requests": 128,
            "served_model_name": "kimi",
            "speculative": {"algorithm": "eagle3", "draft_model": "/m/eagle", "draft_tokens": 3},
        }
    )
    argv = render(p)
    assert argv[:3] == ["vllm", "serve", "/m/target"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--max-num-seqs") + 1] == "128"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/m/eagle", "num_speculative_tokens": 3}


def test_sglang_command_line_sets_all_three_spec_values_and_the_cap() -> None:
    p = LaunchParams.model_validate(
        {
            "flavour": "sglang",
            "model": "/m/kimi",
            "port": 30000,
            "tensor_parallel": 8,
            "max_running_requests": 128,
            "extra_args": ["--mem-fraction-static", "0.85"],
            "speculative": {"algorithm": "EAGLE3", "draft_model": "/m/eagle3", "draft_tokens": 3},
        }
    )
    argv = render(p)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--model-path") == "/m/kimi" and flag("--tp-size") == "8"
    assert flag("--speculative-algorithm") == "EAGLE3"
    assert flag("--speculative-draft-model-path") == "/m/eagle3"
    # topk 1: num_draft_tokens is forced to num_steps + 1; all three or none.
    assert (
        flag("--speculative-num-steps"),
        flag("--speculative-eagle-topk"),
        flag("--speculative-num-draft-tokens"),
    ) == ("3", "1", "4")
    assert flag("--max-running-requests") == "128"
    assert "--enable-metrics" in argv and argv[-2:] == ["--mem-fraction-static", "0.85"]


def test_a_server_without_its_model_is_a_plan_error(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    plan = pd.write("""
    name: t
    tasks:
      - id: launch
        kind: server.launch
        params: {flavour: vllm, port: 8000}
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2
    assert "plan.yaml:6:" in r.stderr and "flavour vllm needs `model`" in r.stderr
    plan = pd.write("""
    name: t
    tasks:
      - id: bench
        kind: bench.serve
        params: {url: "http://127.0.0.1:1", concurrency: [1, 0]}
    """)
    r = run_orch("validate", plan)  # a semaphore of 0 would wait for ever
    assert r.returncode == 2
    assert "param 'concurrency.1': Input should be greater than or equal to 1" in r.stderr
    assert "Traceback" not in r.stderr


# --- the metrics ---------------------------------------------------------------------------------


def test_percentiles_interpolate_linearly_like_numpy() -> None:
    got = stats_ms([x / 1000 for x in range(1, 11)])  # 1..10 ms
    assert got == pytest.approx({"mean": 5.5, "p50": 5.5, "p90": 9.1, "p99": 9.91})


def test_tpot_excludes_the_first_token_and_one_token_requests() -> None:
    a = Outcome(ok=True, ttft=0.1, latency=1.1, output_tokens=11, itl=[0.1] * 10)
    b = Outcome(ok=True, ttft=0.2, latency=0.2, output_tokens=1)
    failed = Outcome(ok=False, error="HTTP 500")
    level = summarize_level(4, [a, b, failed], duration=2.0)
    assert level["tpot"]["mean"] == pytest.approx(100.0)  # (1.1 - 0.1) / (11 - 1) s
    assert level["output_tok_s"] == pytest.approx(6.0) and level["request_s"] == 1.0
    assert level["achieved_concurrency"] == pytest.approx(0.65)  # (1.1 + 0.2) / 2.0
    assert (level["completed"], level["errors"], level["first_error"]) == (2, 1, "HTTP 500")


def test_vllm_acceptance_is_the_difference_of_its_counters() -> None:
    """The vLLM adapter's counts (its /metrics counters, by orch's names) around a window."""
    vllm = ENGINES["vllm"]
    before = {"drafts": 100, "proposed": 300, "accepted": 50, "pos0": 40, "pos1": 10, "pos2": 0}
    after = {"drafts": 300, "proposed": 900, "accepted": 180, "pos0": 120, "pos1": 50, "pos2": 10}
    counts = vllm.window_counts(before, after, [])
    assert counts is not None
    got = measured(vllm, counts, None)
    assert got is not None
    assert got["accept_length"] == pytest.approx(1.65) and got["draft_tokens"] == 3
    assert got["acceptance"] == pytest.approx(130 / 600)  # = (tau-1)/k
    assert got["alpha"] == pytest.approx(0.411, abs=1e-3)
    assert got["per_position"] == [0.4, 0.2, 0.05]
    assert got["counts"]["accepted"] == 130
    assert (got["drafts"], got["proposed"], got["accepted"]) == (200, 600, 130)  # v2's names
    assert vllm.window_counts(before, before, []) is None  # no drafts: speculation was off


def test_sglang_meta_info_gives_acceptance_from_its_draft_counts() -> None:
    """Shapes as a real SGLang sends them (tests/sglang_shapes.py, checked against one by
    tests/test_sglang.py), read by the SGLang adapter."""
    sglang = ENGINES["sglang"]
    out = Stream()
    first = {"text": "Hel", "meta_info": {"completion_tokens": 1, "prompt_tokens": 42}}
    assert sglang.read_chunk("sglang", first, out)
    assert not sglang.read_chunk("sglang", {"text": "Hel", "meta_info": {}}, out)
    assert sglang.read_chunk("sglang", GENERATE_FINAL_CHUNK, out)
    assert (out.output_tokens, out.prompt_tokens) == (256, 42)
    assert out.counts == {"verify_passes": 155, "correct_drafts": 100, "proposed_drafts": 465}
    other = Stream(100, 0, {"verify_passes": 45, "correct_drafts": 30, "proposed_drafts": 135})
    counts = sglang.window_counts({}, {}, [out, other])
    assert counts is not None
    got = measured(sglang, counts, 3)
    assert got is not None
    # 1 + accepted drafts per verify pass, summed over requests (not the mean of each's).
    assert got["accept_length"] == pytest.approx(1 + 130 / 200)
    assert got["acceptance"] == pytest.approx(130 / 600)
    assert got["engine_accept_rate"] == pytest.approx(130 / 600, abs=1e-4)
    assert (got["counts"]["correct_drafts"], got["counts"]["proposed_drafts"]) == (130, 600)
    assert (got["verify_passes"], got["correct_drafts"], got["proposed_drafts"]) == (200, 130, 600)
    # SGLang's own accept length counts each answer's first token (the prefill's) too.
    assert got["engine_accept_length"] == pytest.approx(356 / 200, abs=1e-4)
    # An SGLang that reports no draft counts: tau from output tokens / verify passes.
    bare = sglang.window_counts({}, {}, [Stream(356, 0, {"verify_passes": 200})])
    assert bare is not None
    assert measured(sglang, bare, 3)["accept_length"] == pytest.approx(356 / 200)  # type: ignore[index]
    # The benchmark hands the adapter its answers that succeeded only.
    failed = Outcome(ok=False, output_tokens=50, counts={"verify_passes": 40})
    ok = [Outcome(ok=True, output_tokens=s.output_tokens, counts=s.counts) for s in (out, other)]
    target = Target("http://h", "m", "sglang", "sglang", {})
    assert of_window(target, {}, {}, [*ok, failed], 3) == got


def test_an_unknown_flavour_or_api_is_a_plan_error_with_its_line(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(
        "name: p\ntasks:\n  - id: a\n    kind: server.launch\n"
        "    params: {flavour: llamacp, model: m, port: 1}\n"
        "  - id: b\n    kind: bench.serve\n    params: {url: 'http://h', api: generate}\n"
    )
    done = run_orch("run", plan)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "p.yaml:5: task 'a': param 'flavour': 'llamacp' is none of" in done.stderr
    assert "(did you mean 'llamacpp'?)" in done.stderr
    assert "p.yaml:8: task 'b': param 'api': 'generate' is none of auto, openai" in done.stderr


def test_why_a_benchmark_has_no_acceptance_is_said() -> None:
    def why(engine: str | None, api: str, algorithm: str | None) -> str | None:
        target = Target("http://h", "m", api, engine, {})  # type: ignore[arg-type]
        return unmeasured_acceptance(target, algorithm)

    assert "none of the engines orch knows (SGLang" in str(why(None, "openai", None))
    assert "native /generate only" in str(why("sglang", "openai", "EAGLE3"))
    assert "in /generate's meta_info" in str(why("sglang", "sglang", "EAGLE3"))
    assert "in its /metrics counters" in str(why("vllm", "openai", "eagle3"))
    assert why("vllm", "openai", None) is None and why("sglang", "sglang", None) is None


def test_a_server_given_by_url_is_asked_what_it_is(tmp_path: Path) -> None:
    """vLLM answers /version; a server that answers neither it nor SGLang's /server_info is
    no engine orch knows (tests/test_sglang.py asks a real SGLang)."""
    for version in ("0.32.0", None):
        port = free_port()
        args = [sys.executable, STUB, str(port), *(["--version", version] if version else [])]
        stub = subprocess.Popen(args, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for(lambda p=port: bool(listeners(p)), timeout=30, what="the stub")
            got = identify(f"http://127.0.0.1:{port}")
            assert got == ({"flavour": "vllm", "version": version} if version else {})
        finally:
            os.killpg(stub.pid, signal.SIGKILL)
            stub.wait()


# --- lifecycles through orch run ----------------------------------------------------------------


def test_launch_waits_for_the_load_benchmarks_and_stop_leaves_no_process(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    plan = pd.write(
        stub_plan(
            port,
            stub_args="--child --load 1.5 --version 0.0.1-stub",
            extra="""
      - id: bench
        kind: bench.serve
        needs: [launch]
        params: {server: launch, concurrency: [1, 4], requests: 8, warmup: 3,
                 output_tokens: 20, input_words: 9, input_tokens: 6, progress_every: 0.05s}
      - id: stop
        kind: server.stop
        needs: [bench]
        params: {server: launch}
    """,
        )
    )
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "loading for" in r.stderr and "connection refused" in r.stderr  # progress shown
    assert re.search(r"c=1 window 1: \d/8 requests done, [\d.]+ tok/s so far", r.stderr)
    launch = findings(plan, "launch")
    assert float(str(launch["ready_after"])) >= 1.5
    assert launch["served_model"] == "stub" and launch["max_model_len"] == 4096
    assert launch["supervisor"] == f"pid {launch['pid']}"
    bench = findings(plan, "bench")
    assert bench["accept_length"] == 2.0 and bench["draft_tokens"] == 3
    assert bench["acceptance"] == pytest.approx(0.3333)
    result = json.loads(Path(str(bench["result"])).read_text())
    assert result["schema"] == "orch.bench/v2"
    for level in result["levels"]:
        n = 8 * level["windows"]  # the kept windows' requests, pooled
        assert level["completed"] == n and level["output_tokens"] == n * 20
        assert level["input_tokens"] == n * 6  # cut to 6 by the server's /tokenize
        # Warm-up requests and thrown-away windows moved the server's counters too, but
        # between the scrapes around each kept window.
        assert level["spec"]["counts"]["drafts"] == n * 10
        assert level["tpot"]["mean"] >= 2.0  # the stub sleeps 2 ms per token
        # One token per chunk, all requests of one length: ITL and TPOT are the same gaps.
        assert level["itl"]["mean"] == pytest.approx(level["tpot"]["mean"])
    assert 0.9 <= result["levels"][0]["achieved_concurrency"] <= 1.0
    assert findings(plan, "stop")["stopped"] is True
    with pd.db() as db:
        row = db.execute("SELECT released_by, how FROM resources").fetchone()
    assert tuple(row) == ("stop", "by task stop")


def test_a_server_that_dies_while_loading_fails_with_its_last_words(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    plan = pd.write(stub_plan(free_port(), stub_args="--load 30 --die-after 0.5"))
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 1
    with pd.db() as db:
        error = db.execute("SELECT last_error FROM todos WHERE id='launch'").fetchone()[0]
    assert "the server exited while loading (connection refused)" in error
    assert "stub: out of memory while loading weights" in error


def test_a_port_in_use_is_refused_naming_its_holder(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        plan = pd.write(stub_plan(port))
        r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 1
    assert f"port {port} is already in use by pid {os.getpid()}" in r.stderr


def test_the_end_of_a_run_stops_its_servers_and_a_resume_relaunches(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    flag = tmp_path / "fixed"
    plan = pd.write(
        stub_plan(
            port,
            extra=f"""
      - id: use
        kind: shell
        needs: [launch]
        params: {{command: "curl -sf http://127.0.0.1:{port}/health && test -f {flag}"}}
    """,
        )
    )
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 1 and "resource.released" in r.stderr
    assert not marked_processes(tmp_path, "ORCH_SERVER=launch@1:")  # the end of run 1 stopped it
    dry = run_orch("plan", plan, cwd=tmp_path)  # `orch plan` says what `run` will do, and why
    assert re.search(
        r"run\s+launch\s+what it held was ended \(at the end of run #1\); use "
        r"still needs it",
        dry.stdout,
    ), dry.stdout
    flag.touch()
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "task.revived" in r.stderr and "use still needs it" in r.stderr
    with pd.db() as db:
        attempts = dict(db.execute("SELECT id, attempts FROM todos").fetchall())
    assert attempts == {"launch": 2, "use": 2}
    # Finished: a third run redoes nothing, although the server was stopped again.
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0 and "task.started" not in r.stderr


def test_a_killed_run_leaves_its_server_to_the_next_run_which_ends_it(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    flag = tmp_path / "go"
    plan = pd.write(
        stub_plan(
            port,
            extra=f"""
      - id: wait
        kind: shell
        needs: [launch]
        params: {{command: "until test -f {flag}; do sleep 0.1; done"}}
    """,
        )
    )
    orch = start_orch("run", plan, cwd=tmp_path)
    wait_for(
        lambda: pd.status_of("wait") == "in_progress", timeout=30, what="the shell task to start"
    )
    os.killpg(orch.pid, signal.SIGKILL)  # orch and the shell task die; the server does not
    orch.communicate()
    first = marked_processes(tmp_path, "ORCH_SERVER=launch@1:")
    assert len(first) == 2  # the stub and its child
    flag.touch()
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "left running by an earlier run" in r.stderr
    assert not any(pid_alive(pid) for pid in first)
    assert pd.statuses() == {"launch": "completed", "wait": "completed"}


def test_a_rollback_with_nothing_armed_still_ends_a_killed_runs_server(tmp_path: Path) -> None:
    """Nothing to undo but a server left running: `orch rollback` ends it (a run recorded)."""
    pd = PlanDir(tmp_path)
    flag = tmp_path / "go"
    extra = f"""
      - id: wait
        kind: shell
        needs: [launch]
        params: {{command: "until test -f {flag}; do sleep 0.1; done"}}
    """
    plan = pd.write(stub_plan(free_port(), extra=extra))
    orch = start_orch("run", plan, cwd=tmp_path)
    # Its process, not only its status: in_progress is committed before the spawn.
    wait_for(lambda: marked_processes(tmp_path, "ORCH_TASK=1:wait:"), 30, "wait running")
    os.killpg(orch.pid, signal.SIGKILL)
    orch.communicate()
    first = marked_processes(tmp_path, "ORCH_SERVER=launch@1:")
    assert first
    waiting_pids = marked_processes(tmp_path, "ORCH_TASK=1:wait:")
    (waiting,) = {marker_of(pid, "ORCH_TASK") for pid in waiting_pids}
    r = run_orch("rollback", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "left running by an earlier run" in r.stderr
    assert not any(pid_alive(pid) for pid in first)
    assert r.stdout.startswith("t · run #2 completed"), r.stdout
    flag.touch()  # a task's leftover is the next `orch run`'s to end (end_leftovers)
    wait_for(lambda: not marked_processes(tmp_path, "ORCH_TASK=1:wait:"), what="wait's end")
    jail(waiting).end(grace=1.0)  # as that run would: its jail's cgroup is not left behind


def test_a_server_process_that_leaves_its_group_is_ended_too(tmp_path: Path) -> None:
    """`setsid` takes a process out of the group, not out of the environment marker."""
    pd = PlanDir(tmp_path)
    port = free_port()
    escape = f"setsid sleep 300 & exec {sys.executable} {STUB} {port}"
    plan = pd.write(
        stub_plan(
            port,
            command=f"[bash, -c, {json.dumps(escape)}]",
            extra="""
      - id: stop
        kind: server.stop
        needs: [launch]
        params: {server: launch}
    """,
        )
    )
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "every process it spawned (2 processes: " in r.stderr  # bash's python, and the sleep
    assert marked_processes(tmp_path) == []


class RecordingSink:
    """What server.launch tells the engine, and which of its processes existed at each hold."""

    def __init__(self) -> None:
        self.holds: list[tuple[dict[str, Any], list[int]]] = []

    def hold(self, name: str, data: dict[str, Any]) -> None:
        self.holds.append((data, marked(("ORCH_SERVER", data["marker"]))))

    def finding(self, finding: object) -> None: ...
    def process_started(self, pgid: int, started_at: float) -> None: ...
    def progress(self, message: str) -> None: ...
    def held(self, name: str) -> dict[str, Any] | None: ...
    def release(self, name: str) -> None: ...


def test_a_server_is_held_before_any_of_its_processes_exists(tmp_path: Path) -> None:
    """An orch killed at any moment after the start has committed the marker that finds
    every process of the server (the next run ends them by it)."""
    port = free_port()
    params = LaunchParams(
        flavour="command",
        command=[sys.executable, STUB, str(port), "--child"],
        port=port,
        ready_timeout=30,
    )
    sink = RecordingSink()
    ctx = Context("launch", 1, 1, tmp_path / "launch.log", None, sink)
    ServerLaunch(params).run(ctx)
    (first, before), (second, after), *_ = sink.holds
    try:
        assert before == [] and first["marker"] and first["pid"] is None
        assert second["marker"] == first["marker"] and after == [second["pid"]]
    finally:
        ServerLaunch.release(sink.holds[-1][0])
    assert marked(("ORCH_SERVER", first["marker"])) == []


def test_an_orch_killed_as_its_server_starts_leaves_it_to_the_next_run(tmp_path: Path) -> None:
    """An orch SIGKILLed by its server's first act: the next run ends the orphan and
    relaunches on the port it held."""
    pd = PlanDir(tmp_path)
    port = free_port()
    flag = tmp_path / "killed-once"
    # The server's first act, once only: SIGKILL the orch that started it.
    start = f"[ -e {flag} ] || {{ touch {flag}; kill -9 $PPID; }}; exec {sys.executable} {STUB} "
    plan = pd.write(stub_plan(port, command=f"[bash, -c, {json.dumps(start + str(port))}]"))
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == -9
    wait_for(lambda: bool(marked_processes(tmp_path)), what="the orphaned server")
    orphan = marked_processes(tmp_path)
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # the port was free again for the relaunch
    assert "left running by an earlier run" in r.stderr
    assert not any(pid_alive(pid) for pid in orphan)


def test_process_stop_ends_a_hand_started_server_with_its_children(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, STUB, str(port), "--child"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    ["curl", "-sf", f"http://127.0.0.1:{port}/health"], capture_output=True
                ).returncode
                == 0
            ),
            what="the stub",
        )
        group = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and pid_alive(int(p)) and os.getpgid(int(p)) == server.pid
        ]
        assert len(group) == 2
        plan = pd.write(f"""
        name: t
        tasks:
          - id: stop
            kind: process.stop
            params: {{port: {port}, grace: 5s}}
        """)
        r = run_orch("run", plan, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        server.wait(timeout=5)
        assert not any(pid_alive(p) for p in group)
        assert findings(plan, "stop")["processes_ended"] == 2
        # Again: nothing listens now, which is what was wanted.
        r = run_orch("run", plan, "--rerun", "stop", cwd=tmp_path)
        assert r.returncode == 0 and "already stopped" in r.stderr
    finally:
        server.kill()


def test_a_server_gets_its_own_temp_folder_removed_when_it_stops(tmp_path: Path) -> None:
    """vLLM leaves IPC sockets and caches in its TMPDIR: each server gets a private one, gone
    with the server (a later run that ends it after a crash removes it the same way)."""
    pd = PlanDir(tmp_path)
    port = free_port()
    probe = (
        f"echo $TMPDIR > {tmp_path}/tmpdir; touch $TMPDIR/socket; "
        f"exec {sys.executable} {STUB} {port}"
    )
    plan = pd.write(
        stub_plan(
            port,
            command=f"[bash, -c, {json.dumps(probe)}]",
            extra=f"""
      - id: look
        kind: shell
        needs: [launch]
        params: {{command: "test -e $(cat {tmp_path}/tmpdir)/socket"}}
      - id: stop
        kind: server.stop
        needs: [look]
        params: {{server: launch}}
    """,
        )
    )
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    scratch = Path((tmp_path / "tmpdir").read_text().strip())
    assert scratch.name.startswith("orch-") and scratch.parent == Path(tempfile.gettempdir())
    assert not scratch.exists()
