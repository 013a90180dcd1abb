"""The flagship's SGLang paths against a real SGLang (its CPU build), through `orch run`.

`scripts/sglang_cpu/setup.sh` builds SGLang and its kernels from a fork pinned by commit, and
the tiny models (~6 min the first time; docs/guide.md, "SGLang, for real"). It needs that
fork's source, which a CI machine cannot reach: where `.servers/sglang` is absent and
SGLANG_GIT unset, these tests skip and say how to build it. Each configuration is launched
once (~15 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.proc.procfs import session_members

from conftest import PlanDir, free_port, pid_alive, run_orch, start_orch, wait_for
from sglang_shapes import GENERATE_FINAL_CHUNK, SERVER_INFO, missing
from test_servers import findings, marked_processes

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "sglang_cpu" / "setup.sh"
SERVERS = ROOT / ".servers"
SGLANG = SERVERS / "sglang"
CLI = ROOT / "scripts" / "sglang_cpu" / "sglang_cli.py"
VERSION = re.search(r"^COMMIT=(\w{9})", SETUP.read_text(), re.M)

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="session")
def sglang_cpu() -> Path:
    """SGLang's venv and models (seconds when setup.sh has run; a build where SGLANG_GIT says
    where the source is)."""
    if not (SGLANG / "venv").exists() and "SGLANG_GIT" not in os.environ:
        pytest.skip(
            "SGLang's CPU build is absent: SGLANG_GIT=<fork> scripts/sglang_cpu/setup.sh "
            "builds it (docs/guide.md: SGLang, for real)"
        )
    done = subprocess.run([str(SETUP), str(SERVERS)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"scripts/sglang_cpu/setup.sh failed:\n{done.stdout}{done.stderr}"
    return SGLANG


def launch(name: str, port: int, spec: str = "") -> str:
    """A server.launch of SGLang's CPU build, as plans/rehearsal_sglang.yaml writes it."""
    return f"""
  - id: launch_{name}
    kind: server.launch
    params:
      flavour: sglang
      launcher: [{SGLANG}/venv/bin/python, {CLI}]
      model: {SGLANG}/models/target
      served_model_name: tiny
      port: {port}
      max_running_requests: 8
      extra_args: [--device, cpu, --max-total-tokens, "16384"]
      # SGLang's caches (torch inductor's) beside its build, not in the user's ~/.cache.
      env: {{SGLANG_USE_CPU_ENGINE: "1", HF_HUB_OFFLINE: "1", SGLANG_CLI_FORCE_AMX: "1",
            SGLANG_CACHE_DIR: "{SGLANG}/cache"}}
      ready_timeout: 4m
      progress_every: 5s{spec}"""


def bench(name: str, target: str) -> str:
    return f"""
  - id: bench_{name}
    kind: bench.serve
    params: {{{target}, concurrency: [1, 4], requests: 8, warmup: 0, output_tokens: 32,
             input_words: 24, min_windows: 1, max_windows: 2}}"""


def speculative(algorithm: str, draft: str) -> str:
    return (
        f"\n      speculative: {{algorithm: {algorithm}, draft_model: '{SGLANG}/models/{draft}', "
        "draft_tokens: 3}"
    )


def step(name: str, kind: str, needs: str, params: str) -> str:
    return f"\n  - id: {name}\n    kind: {kind}\n    needs: [{needs}]\n    params: {params}"


@pytest.fixture(scope="module")
def served(sglang_cpu: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One run: SGLang's base, EAGLE-3 (random drafter), the target drafting for itself
    (STANDALONE); each benchmarked; the EAGLE-3 server also by URL, its /server_info and one
    streamed /generate saved; each stopped."""
    root = tmp_path_factory.mktemp("sglang")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The last data line of a stream is the [DONE] marker; the one before, the final chunk.
    samples = f"""
  - id: samples
    kind: shell
    needs: [bench_by_url]
    params:
      command: |
        curl -sf {url}/server_info > server_info.json
        curl -sfN {url}/generate -H 'Content-Type: application/json' -d '{{"text": "Hello",
          "stream": true, "sampling_params": {{"max_new_tokens": 16, "temperature": 0,
          "ignore_eos": true}}}}' | grep '^data: {{' | tail -1 | cut -c7- > generate.json"""
    text = "name: t\ntasks:"
    previous = ""
    for name, spec in (
        ("base", ""),
        ("eagle3", speculative("EAGLE3", "eagle3")),
        ("self", speculative("STANDALONE", "target")),
    ):
        text += launch(name, port, spec) + (f"\n    needs: [{previous}]" if previous else "")
        text += bench(name, f"server: launch_{name}") + f"\n    needs: [launch_{name}]"
        last = f"bench_{name}"
        if name == "eagle3":
            text += bench("by_url", f"url: '{url}'") + "\n    needs: [bench_eagle3]"
            text += samples
            last = "samples"
        text += step(f"stop_{name}", "server.stop", last, f"{{server: launch_{name}}}")
        previous = f"stop_{name}"
    plan = PlanDir(root).write(text)
    r = run_orch("run", plan, cwd=root, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return root, plan


def result(plan: Path, task: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Path(str(findings(plan, task)["result"])).read_text())
    return doc


def test_launch_records_what_sglang_resolved(served: tuple[Path, Path]) -> None:
    root, plan = served
    got = findings(plan, "launch_eagle3")
    assert VERSION is not None and str(got["version"]).endswith(f"+g{VERSION.group(1)}.patched")
    assert got["served_model"] == "tiny" and got["max_running_requests"] == 8
    assert got["speculative_algorithm"] == "EAGLE3" and got["speculative_num_steps"] == 3
    assert got["speculative_num_draft_tokens"] == 4 and got["speculative_eagle_topk"] == 1
    assert got["attention_backend"] == "intel_amx"  # the fixture's switch took (sglang_cli.py)
    assert got["max_total_tokens"] == 16384 and got["device"] == "cpu"
    assert "cuda_graph_max_bs" not in got  # a CPU runs no CUDA graphs: no level is marked
    log = (root / ".orch/t.runs/1/launch_eagle3.log").read_text()
    assert "--enable-metrics" in log and "--speculative-num-draft-tokens 4" in log


def test_acceptance_per_level_is_sglangs_own_counts_summed(served: tuple[Path, Path]) -> None:
    """Each level's acceptance from its own requests' meta_info, checked against the identity
    SGLang's counts obey: every output token is the prefill's first, an accepted draft, or a
    verify pass's own token (a pass cut by max_new_tokens drops some: at most that many)."""
    _, plan = served
    taus = {}
    for name in ("eagle3", "self"):
        doc = result(plan, f"bench_{name}")
        assert doc["server"]["engine"] == "sglang" and "meta_info" in doc["spec"]["source"]
        for level in doc["levels"]:
            spec = level["spec"]
            n = spec["counts"]  # SGLang's own counts, as its adapter names them
            assert n["proposed_drafts"] == n["verify_passes"] * 3  # k = 3 per pass
            assert spec["engine_accept_rate"] == pytest.approx(
                n["correct_drafts"] / n["proposed_drafts"], abs=1e-4
            )
            unexplained = n["output_tokens"] - n["verify_passes"] - n["correct_drafts"]
            assert 0 <= unexplained <= level["completed"], spec
            assert spec["accept_length"] == pytest.approx(
                1 + n["correct_drafts"] / n["verify_passes"]
            )
            assert spec["acceptance"] == pytest.approx(spec["engine_accept_rate"], abs=1e-4)
            assert spec["engine_accept_length"] == pytest.approx(
                n["output_tokens"] / n["verify_passes"], abs=1e-4
            )
        got = findings(plan, f"bench_{name}")
        assert {"c1.accept_length", "c4.accept_length"} <= got.keys()
        taus[name] = float(str(got["accept_length"]))
    assert taus["self"] > 1.2  # the target drafting for itself: drafts accepted
    assert taus["self"] > taus["eagle3"] >= 1.0  # a random EAGLE-3 head: almost none


def test_a_benchmark_by_url_reads_the_speculation_from_the_server(
    served: tuple[Path, Path],
) -> None:
    _, plan = served
    doc = result(plan, "bench_by_url")
    assert doc["server"]["engine"] == "sglang" and doc["benchmark"]["api"] == "sglang"
    assert doc["server"]["settings"]["speculative_algorithm"] == "EAGLE3"
    assert doc["spec"]["draft_tokens"] == 3 and doc["spec"]["counts"]["verify_passes"] > 0
    assert "acceptance_unmeasured" not in findings(plan, "bench_by_url")


def test_the_formats_orch_reads_are_the_ones_sglang_sends(served: tuple[Path, Path]) -> None:
    """tests/sglang_shapes.py, which the unit tests parse, against this SGLang's own output."""
    root, _ = served
    chunk = json.loads((root / "generate.json").read_text())
    assert missing(GENERATE_FINAL_CHUNK, chunk) == []
    assert chunk["meta_info"]["completion_tokens"] == 16
    info = json.loads((root / "server_info.json").read_text())
    assert missing(SERVER_INFO, info) == []


def test_server_stop_ends_every_sglang_process(served: tuple[Path, Path]) -> None:
    root, plan = served
    assert marked_processes(root) == []
    for name in ("base", "eagle3", "self"):
        assert findings(plan, f"stop_{name}")["stopped"] is True


def test_sglangs_processes_outlive_a_killed_orch_and_end_with_the_next_run(
    sglang_cpu: Path, tmp_path: Path
) -> None:
    """SIGKILL to orch while SGLang serves: its four processes (the API server, the scheduler,
    the detokenizer, multiprocessing's resource tracker) stay, held in the store; the next run
    ends every one of them before it goes on."""
    pd = PlanDir(tmp_path)
    plan = pd.write(
        "name: t\ntasks:"
        + launch("base", free_port())
        + step("hold", "shell", "launch_base", '{command: "while [ ! -e go ]; do sleep 0.2; done"}')
        + step("stop", "server.stop", "hold", "{server: launch_base}")
    )
    orch = start_orch("run", plan, cwd=tmp_path)
    try:
        wait_for(lambda: pd.status_of("hold") == "in_progress", timeout=300, what="the launch")
        # setproctitle writes the scheduler's and detokenizer's titles over their environment:
        # two of the four carry orch's marker, all four are in the server's session.
        pids = session_members([int(str(findings(plan, "launch_base")["pid"]))])
        assert len(pids) == 4 and len(marked_processes(tmp_path)) == 2, pids
        os.killpg(orch.pid, signal.SIGKILL)
        orch.communicate()
        assert all(pid_alive(p) for p in pids)
        (tmp_path / "go").touch()
        r = run_orch("run", plan, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert not any(pid_alive(p) for p in pids)
        assert marked_processes(tmp_path) == []
    finally:
        if orch.poll() is None:
            os.killpg(orch.pid, signal.SIGKILL)
            orch.communicate()


def test_the_flagships_sglang_arguments_pass_sglangs_own_parser(sglang_cpu: Path) -> None:
    """Every server.launch of plans/sglang_migration.yaml, rendered as orch renders it, parsed
    by the pinned SGLang's argument parser: a flag SGLang renamed or removed fails here."""
    from orchestrator.plan.model import load_plan
    from orchestrator.plan.templating import resolve
    from tasks.serving.launch import LaunchParams, render

    plan = load_plan(ROOT / "plans" / "sglang_migration.yaml")

    launches = [t for t in plan.tasks if t.spec.kind == "server.launch"]
    assert len(launches) == 4
    for task in launches:
        params = LaunchParams(**resolve(task.spec.params, lambda ref: plan.vars[ref.name]))
        argv = render(params)[len(params.launcher or []) :]
        parsed = subprocess.run(
            [str(SGLANG / "venv/bin/python"), "-c", PARSE, json.dumps(argv)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert parsed.returncode == 0, (task.id, argv, parsed.stderr[-2000:])
        args = json.loads(parsed.stdout.splitlines()[-1])
        assert args["model_path"] == plan.vars["model_path"] and args["tp_size"] == 8
        assert args["enable_metrics"] is True and args["mem_fraction_static"] == 0.85
        assert args["max_running_requests"] == plan.vars["max_running_requests"]
        assert args["cuda_graph_max_bs_decode"] == plan.vars["cuda_graph_max_bs"]
        if params.speculative:
            assert args["speculative_algorithm"] == "EAGLE3"
            assert args["speculative_num_steps"] == 3 and args["speculative_num_draft_tokens"] == 4


# SGLang's own parser (sglang/srt/server_args.py): an unknown flag exits 2 with its name.
PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print(json.dumps(vars(parser.parse_args(json.loads(sys.argv[1]))), default=str))
"""
