"""The third engine, llama.cpp's server, known to orch through one module
(tasks/serving/engines/llamacpp.py): launched, benchmarked with its own speculative decoding
and counters, and analyzed, by the same kinds as vLLM and SGLang, for real.

`scripts/llamacpp/setup.sh` builds llama-server from the llama.cpp that llama-cpp-python
vendors, and converts the tiny models to GGUF (.ci/run calls it; so does the fixture when it
has not run: ~20 min on 2 cores the first time).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator import TaskError
from tasks.serving.engines import ENGINES
from tasks.serving.launch import LaunchParams, render

from conftest import free_port, run_orch

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "llamacpp" / "setup.sh"
SERVERS = ROOT / ".servers"
PLAN = ROOT / "plans" / "rehearsal_llamacpp.yaml"


@pytest.fixture(scope="session")
def llamacpp() -> Path:
    """llama-server and the GGUF models (built here if .ci/run has not)."""
    done = subprocess.run([str(SETUP), str(SERVERS)], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, f"scripts/llamacpp/setup.sh failed:\n{done.stdout}{done.stderr}"
    return SERVERS / "llamacpp"


def test_its_adapter_speaks_llama_servers_flags() -> None:
    p = LaunchParams.model_validate(
        {
            "flavour": "llamacpp",
            "model": "/m/target.gguf",
            "port": 8300,
            "max_running_requests": 4,
            "speculative": {
                "algorithm": "draft-simple",
                "draft_model": "/m/noisy.gguf",
                "draft_tokens": 3,
            },
        }
    )
    argv = render(p)
    assert argv[:3] == ["llama-server", "-m", "/m/target.gguf"]
    assert argv[argv.index("--alias") + 1] == "/m/target.gguf"  # what /v1/models lists
    expected = {
        "--parallel": "4",
        "--spec-type": "draft-simple",
        "--spec-draft-model": "/m/noisy.gguf",
        "--spec-draft-n-max": "3",
    }
    for flag, value in expected.items():
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--metrics" in argv and "--served-model-name" not in argv
    named = p.model_copy(update={"served_model_name": "tiny"})
    assert render(named)[render(named).index("--alias") + 1] == "tiny"
    with pytest.raises(TaskError, match="no tensor_parallel"):
        render(p.model_copy(update={"tensor_parallel": 2}))
    assert ENGINES["llamacpp"].rate_definition == "strict"


def test_the_rehearsals_shape_runs_on_llama_cpp_with_its_own_acceptance(
    llamacpp: Path, tmp_path: Path
) -> None:
    """Base, a noisy draft, the target drafting for itself, the base again, the analysis:
    acceptance from llama-server's /metrics counters, through its adapter alone."""
    store = tmp_path / "rehearsal.db"
    args = ["--store", store, "--var", f"servers={llamacpp}", "--var", f"port={free_port()}"]
    done = run_orch("run", PLAN, *args, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(run_orch("status", PLAN, "--store", store, "--json").stdout)
    assert {t["status"] for t in status["tasks"]} == {"completed"}, status

    found = {t["id"]: {f["key"]: f["value"] for f in t["findings"]} for t in status["tasks"]}

    def result(task: str) -> dict[str, object]:
        return json.loads(Path(str(found[task]["result"])).read_text())  # type: ignore[no-any-return]

    base, noisy, custom = (result(t) for t in ("bench_base", "bench_noisy", "bench_custom"))
    for doc in (base, noisy, custom):
        server = doc["server"]
        assert isinstance(server, dict) and server["engine"] == "llamacpp"
        assert str(server["version"]).startswith("b")  # /props' build_info
    assert "spec" not in base  # not speculating: nothing to measure, nothing said missing
    for level in base["levels"]:  # type: ignore[union-attr]
        # Prompts cut to 16 tokens by llama-server's own /tokenize, through its adapter.
        assert level["input_tokens"] == 16 * level["completed"], level
    taus = {}
    for name, doc in (("noisy", noisy), ("custom", custom)):
        spec = doc["spec"]
        assert isinstance(spec, dict) and "llama.cpp /metrics" in spec["source"]
        counts = spec["counts"]
        assert counts["drafts"] > 0 and counts["accepted"] <= counts["proposed"]
        assert spec["accept_length"] == pytest.approx(1 + counts["accepted"] / counts["drafts"])
        assert 1 <= spec["draft_tokens"] <= 3  # at most k a step: llama.cpp drafts fewer
        taus[name] = spec["accept_length"]
    # The target drafting for itself is accepted far more than a noisy copy of it.
    assert taus["custom"] > taus["noisy"] >= 1.0, taus
    verdict = found["analyze"]
    assert {"noisy.verdict", "custom.verdict"} <= verdict.keys(), verdict
    assert all(isinstance(verdict[f"{c}.pays"], bool) for c in ("noisy", "custom")), verdict
