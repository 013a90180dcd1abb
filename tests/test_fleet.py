"""`orch fleet`: a plan rolled over real hosts with real OpenSSH and real Ansible.

Each host is a network namespace with its own sshd and its own systemd (tests/fleet_hosts.py),
running a "production" unit; every host runs the controller's orch (this venv), so each has
the same build. The first tests need no host: the host command and the roll's arithmetic.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.errors import UsageError
from orchestrator.fleet.ansible import HostResult
from orchestrator.fleet.build import build_id
from orchestrator.fleet.folder import FileEntry, Shipped, entries
from orchestrator.fleet.host import Payload, PlanFiles, place_plan, read_payload
from orchestrator.fleet.roll import batch_size, batches_of, judge

from conftest import run_orch, start_orch, wait_for

VENV = str(Path(sys.executable).parent.parent)
HOME = "/var/tmp/orch"  # on each host: its private /var/tmp

# A migration in miniature: stop production (undone if a later step fails), install, bench.
# Each step appends its name to done.log on the host: what ran, and how often.
PLAN = """\
name: migrate
vars: {install_fails: false, slow: 0, tok_s: 100}
tasks:
  - id: stop_production
    kind: systemd.stop
    params: {unit: production.service}
    on_failure:
      id: restore_production
      kind: systemd.start
      params: {unit: production.service}
  - id: install
    kind: shell
    needs: [stop_production]
    params:
      command: >-
        echo install >> /var/tmp/done.log; sleep ${vars.slow};
        test ${vars.install_fails} = false; echo ::finding installed=1
  - id: bench
    kind: shell
    needs: [install]
    params:
      command: "echo bench >> /var/tmp/done.log; echo ::finding tok_s=${vars.tok_s} unit=tok/s"
"""
PRODUCTION = """\
[Unit]
Description=the inference service in production (a stand-in)
[Service]
ExecStart=/bin/sleep infinity
"""


# --- the host command and the roll's arithmetic, without SSH ---------------------------------


def host_command(payload: dict[str, Any], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "orchestrator.fleet.host"],
        input=base64.b64encode(json.dumps(payload).encode()).decode(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert done.returncode in (0, 2, 3), done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def payload(
    home: Path, text: str, modules: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    shipped = [
        Shipped(n, t.encode(), False) for n, t in {"mini.yaml": text, **(modules or {})}.items()
    ]
    plan = {"name": "mini", "file": "mini.yaml", "files": entries(shipped, {})}
    return {"build": build_id(), "plan": plan, "home": str(home), "vars": [], **extra}


MINI = """\
name: mini
vars: {n: 1}
tasks:
  - {id: a, kind: shell, params: {command: "echo ::finding n=${vars.n} unit=GB; echo loud"}}
  - {id: b, kind: python, needs: [a], params: {function: "helper:shout"}}
"""


def test_the_host_command_runs_the_plan_in_its_home_and_answers_in_one_json_line(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    helper = {"helper.py": "def shout(ctx):\n    print('{\"not\": 1}')\n"}
    ask = payload(home, MINI, helper, vars=["n=7"])
    answer = host_command(ask, tmp_path)
    assert answer["result"]["exit_code"] == 0, answer
    assert [t["status"] for t in answer["board"]] == ["completed", "completed"]
    assert answer["board"][0]["findings"] == [{"key": "n", "value": 7, "unit": "GB", "note": None}]
    assert "output_tail" not in answer["board"][0]  # what a task printed stays on the host
    store = home / "mini" / ".orch" / "mini.db"
    assert store.is_file() and Path(answer["result"]["store"]) == store.resolve()
    # Again: the host's own store says it is done; nothing runs.
    again = host_command(ask, tmp_path)
    assert again["result"]["exit_code"] == 0 and again["result"]["run"] is None


def test_the_host_command_refuses_another_build_and_names_both(tmp_path: Path) -> None:
    answer = host_command(payload(tmp_path, MINI, build="0.0.1+000000000000"), tmp_path)
    assert answer["refused"] == f"orch here is {build_id()}, the controller's is 0.0.1+000000000000"
    assert not (tmp_path / "mini").exists()  # nothing placed, nothing run


@pytest.mark.parametrize("name", ["../evil.yaml", "/etc/passwd", "..", "a/b.py", ""])
def test_the_host_command_places_plain_file_names_only(tmp_path: Path, name: str) -> None:
    ask = payload(tmp_path / "home", MINI)
    ask["plan"]["file"] = name
    ask["plan"]["files"][name] = ask["plan"]["files"]["mini.yaml"]
    answer = host_command(ask, tmp_path)
    assert answer["exit_code"] == 2 and "not a plain file name" in answer["error"]
    assert not (tmp_path / "evil.yaml").exists()


@given(st.text(min_size=1, max_size=20))
def test_place_plan_never_writes_outside_its_folder(name: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        home = Path(tmp) / "home"
        entry = FileEntry(sha256=hashlib.sha256(b"x").hexdigest(), data="eA==")
        try:
            placed, _ = place_plan(home, PlanFiles(name="p", file=name, files={name: entry}))
        except (ValueError, OSError):
            return
        assert placed.resolve().parent == (home / "p").resolve()


@given(
    st.one_of(
        st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda kids: (
                st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
            ),
            max_leaves=12,
        ).map(lambda doc: base64.b64encode(json.dumps(doc).encode()).decode()),
    )
)
def test_a_hostile_payload_is_refused_with_a_reason_never_a_crash(text: str) -> None:
    """What arrives on a host's stdin is read or refused (ValueError), nothing else."""
    from pydantic import ValidationError

    try:
        Payload.model_validate(read_payload(text))
    except (ValueError, ValidationError):
        return


def test_a_bad_inventory_or_option_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    """What Ansible says of a broken inventory, cut to its first complaint and where; no
    inventory, no host, a bad --serial: each a line, exit 2, nothing recorded."""
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    (tmp_path / "bad.yml").write_text("all:\n  hosts: [unclosed\n")
    (tmp_path / "empty.yml").write_text("all:\n  hosts: {}\n")
    (tmp_path / "one.yml").write_text("all:\n  hosts: {h1: {ansible_connection: local}}\n")
    cases = {
        "bad.yml": "ansible-inventory could not read ",
        "nothere.yml": "nothere.yml: no such inventory",
        "empty.yml": "empty.yml has no hosts",
    }
    for inventory, said in cases.items():
        r = run_orch("fleet", "run", plan, "-i", tmp_path / inventory, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "bad.yml:3:1)" in run_orch("fleet", "run", plan, "-i", tmp_path / "bad.yml").stderr
    r = run_orch("fleet", "run", plan, "-i", tmp_path / "one.yml", "--serial", "0%")
    assert r.returncode == 2 and "--serial '0%': give a number of hosts" in r.stderr, r.stderr
    assert not (tmp_path / ".orch" / "p.fleet.db").exists()


def test_batches_are_the_canary_then_serial_numbers_or_shares() -> None:
    hosts = [f"h{i}" for i in range(10)]
    assert batches_of(hosts, 1, "3") == [
        ["h0"],
        ["h1", "h2", "h3"],
        ["h4", "h5", "h6"],
        ["h7", "h8", "h9"],
    ]
    assert batches_of(hosts, 0, "50%") == [hosts[:5], hosts[5:]]
    assert batches_of(hosts, 2, "25%")[1] == ["h2", "h3", "h4"]  # 25% of 10, rounded up
    assert batches_of(hosts[:1], 1, "1") == [["h0"]]
    for bad in ("0", "-1", "x", "0%", "101%"):
        with pytest.raises(UsageError, match="--serial"):
            batch_size(bad, 10)


def test_max_fail_counts_hosts_or_a_share_of_the_batch_as_ansible_does() -> None:
    from orchestrator.fleet.roll import failures_allowed

    assert [failures_allowed("1", n) for n in (1, 6)] == [1, 1]
    assert failures_allowed("0", 10) == 0
    # max_fail_percentage: the roll stops when the share that failed *exceeds* it.
    assert [failures_allowed("10%", n) for n in (6, 10, 25)] == [0, 1, 2]
    assert failures_allowed("50%", 6) == 3 and failures_allowed("100%", 6) == 6
    for bad in ("-1", "x", "101%", ""):
        with pytest.raises(UsageError, match="--max-fail"):
            failures_allowed(bad, 6)


def test_a_host_result_is_judged_by_what_it_answered() -> None:
    python = "/opt/orch/venv/bin/python"

    def said(**kw: Any) -> tuple[str, str | None]:
        base = {"host": "h", "reached": True, "rc": 0, "stdout": "", "stderr": "", "msg": ""}
        state, detail, _ = judge(HostResult(**{**base, **kw}), python)
        return state, detail

    assert said(reached=False, msg="Failed to connect: Connection refused")[0] == "unreachable"
    missing = f"/bin/sh: 1: {python}: not found"  # what the host's shell says, rc 127
    assert said(rc=127, stderr=missing) == (
        "refused",
        f"no orch at {python} (set orch_venv, or install it)",
    )
    assert said(rc=127, stdout="an answer?", stderr=missing)[0] == "failed"  # not refused
    ok = {"result": {"exit_code": 0, "outcome": "completed"}, "board": [], "build": "0.1.0+x"}
    assert said(stdout="noise\n" + json.dumps(ok))[0] == "completed"
    failed = {
        "result": {"exit_code": 1, "outcome": "failed"},
        "board": [
            {"id": "install", "status": "failed", "last_error": "exit code 1", "findings": []}
        ],
        "build": "0.1.0+x",
    }
    assert said(stdout=json.dumps(failed)) == ("failed", "at install (exit code 1)")
    assert said(stdout='{"refused": "orch here is A, the controller\'s is B"}')[0] == "refused"
    assert said(rc=1, stderr="Traceback ...\nKeyError: 'x'")[0] == "error"


# --- real hosts -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hosts() -> Iterator[Any]:
    from fleet_hosts import fleet

    scratch = Path.home() / ".ansible" / "tmp"  # Ansible's own, unless told otherwise
    before = set(scratch.iterdir()) if scratch.is_dir() else set()
    with fleet(3) as f:
        yield f
    left = (set(scratch.iterdir()) if scratch.is_dir() else set()) - before
    assert not left, f"Ansible left {sorted(map(str, left))} (killed controllers included)"


@pytest.fixture
def site(hosts: Any, tmp_path: Path) -> Iterator[Any]:
    """Each test: the three hosts as new (production active, no orch home), a plan folder."""
    for h in hosts.hosts:
        h.run(["rm", "-rf", HOME, "/var/tmp/done.log"])
        h.sandbox.write_unit("production.service", PRODUCTION)
        h.sandbox.daemon_reload()
        assert h.systemctl("start", "production.service").returncode == 0
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "migrate.yaml").write_text(PLAN)
    yield hosts
    for h in hosts.hosts:
        h.run(["bash", "-c", f"pkill -f orchestrator.fleet.host; rm -rf {HOME}"])


def inventory(hosts: Any, tmp_path: Path, **per_host: dict[str, Any]) -> Path:
    host_vars = {h.name: {"orch_home": HOME, **per_host.get(h.name, {})} for h in hosts.hosts}
    extra = per_host.get("_extra", {})
    return hosts.inventory(
        tmp_path / "hosts.yml", host_vars, {"orch_venv": VENV}, extra_hosts=extra
    )


def done_log(host: Any) -> list[str]:
    path = host.private("/var/tmp/done.log")
    return path.read_text().split() if path.exists() else []


def production(host: Any) -> str:
    return str(host.systemctl("is-active", "production.service").stdout.strip())


def signalled_mid_install(
    plan: Path, inv: Path, host: Any, sig: signal.Signals
) -> tuple[int, str, str]:
    """`orch fleet run` (one host a batch) sent `sig` while `host` installs; how it ended."""
    controller = start_orch("fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "1")
    try:
        wait_for(lambda: done_log(host) == ["install"], timeout=120, what=f"{host.name} installs")
        controller.send_signal(sig)
        out, err = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.communicate()
    return controller.returncode, out, err


def fleet_json(plan: Path) -> dict[str, Any]:
    done = run_orch("fleet", "status", plan, "--json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def states(plan: Path) -> dict[str, str]:
    return {h["host"]: h["state"] for h in fleet_json(plan)["hosts"]}


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_roll_stops_at_the_failed_host_puts_it_back_and_resumes_when_fixed(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    values = {"web1": {"tok_s": 100}, "web2": {"install_fails": True, "tok_s": 101}}
    inv = inventory(site, tmp_path, **values, web3={"tok_s": 60})
    roll = ["fleet", "run", plan, "-i", inv, "--canary", "1", "--serial", "1"]

    canary = run_orch(*roll, timeout=180)
    assert canary.returncode == 4, canary.stdout + canary.stderr  # waits after the canary
    assert "orch fleet approve" in canary.stdout
    assert states(plan) == {"web1": "completed", "web2": "pending", "web3": "pending"}
    assert production(web1) != "active"  # the canary migrated
    assert run_orch(*roll, timeout=60).returncode == 4  # no approval, no second batch
    other = run_orch(*roll[:-1], "2", timeout=60)  # --serial 2 on a roll of 1: said, not taken
    assert other.returncode == 4, other.stdout + other.stderr
    kept = "the roll keeps its batches (canary 1, serial 1, max-fail 0); --new-roll"
    assert kept in other.stdout, other.stdout

    approved = run_orch("fleet", "approve", plan, "-m", "canary looks right")
    assert approved.returncode == 0, approved.stderr
    stopped = run_orch(*roll, timeout=180)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "web2 failed: at install" in stopped.stdout and "not started: web3" in stopped.stdout
    assert production(web2) == "active"  # its compensation ran there
    assert production(web3) == "active" and done_log(web3) == []  # never touched
    assert not web3.private(HOME).exists()
    doc = fleet_json(plan)
    assert doc["roll"]["state"] == "stopped" and doc["roll"]["approved_by"]
    by_host = {h["host"]: h for h in doc["hosts"]}
    web2_tasks = {t["id"]: t["status"] for t in by_host["web2"]["tasks"]}
    assert web2_tasks["install"] == "failed" and web2_tasks["restore_production"] == "completed"
    # The host's own store, read there with `orch status`, says the same.
    there = web2.run([f"{VENV}/bin/orch", "status", f"{HOME}/migrate/migrate.yaml", "--json"])
    assert json.loads(there.stdout)["summary"]["failed"] == 1, there.stderr

    # Fixed: web1 is not contacted again, web2 resumes, web3 runs.
    fixed = inventory(site, tmp_path, web1={"tok_s": 100}, web2={"tok_s": 101}, web3={"tok_s": 60})
    resumed = run_orch("fleet", "run", plan, "-i", fixed, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming roll #1" in resumed.stdout
    assert "keeps its batches" not in resumed.stdout  # none asked for: nothing to refuse
    assert states(plan) == {"web1": "completed", "web2": "completed", "web3": "completed"}
    sent = {h["host"]: h["sent"] for h in fleet_json(plan)["hosts"]}
    assert sent == {"web1": 1, "web2": 2, "web3": 1}
    assert done_log(web1) == ["install", "bench"]
    assert done_log(web2) == ["install", "install", "bench"]  # its failed try, then the fix
    assert done_log(web3) == ["install", "bench"]
    assert {production(h) for h in site.hosts} == {"inactive"}

    board = run_orch("fleet", "status", plan)
    assert "roll #1 completed · 3/3 hosts completed" in board.stdout, board.stdout
    assert "bench: tok_s=60 tok/s" in board.stdout
    report = run_orch("report", plan, "--fleet", "--json")
    assert report.returncode == 0, report.stderr
    page = Path(json.loads(report.stdout)["report"]).read_text()
    assert "web3: 60 tok/s" in page  # the outlier of the three, named


@pytest.mark.fleet
@pytest.mark.systemd
def test_max_fail_lets_a_batch_lose_that_many_hosts_and_stops_past_it(
    site: Any, tmp_path: Path
) -> None:
    """Batches of two, `--max-fail 1`: both hosts of the first failing stops the roll there,
    both named; one failing lets it go on, and the roll ends incomplete, naming it."""
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    roll = ["fleet", "run", plan, "--canary", "0", "--serial", "2", "--max-fail", "1"]
    both = inventory(site, tmp_path, web1={"install_fails": True}, web2={"install_fails": True})
    over = run_orch(*roll, "-i", both, timeout=240)
    assert over.returncode == 1, over.stdout + over.stderr
    assert "2 of 2 failed in batch 0, over --max-fail 1: web1, web2" in over.stdout, over.stdout
    assert "not started: web3" in over.stdout and done_log(web3) == []

    one = inventory(site, tmp_path, web2={"install_fails": True})
    log = tmp_path / "ansible.log"  # Ansible's own log: each line names its process
    within = run_orch(
        *roll, "-i", one, "--new-roll", timeout=240, env={"ANSIBLE_LOG_PATH": str(log)}
    )
    assert within.returncode == 1, within.stdout + within.stderr
    assert "going on without web2: within --max-fail 1" in within.stdout, within.stdout
    # Both batches, and the gate between them, in one ansible-playbook.
    plays = re.findall(r" p=(\d+) .*PLAY \[(orch (?:gate|batch) \d+)\]", log.read_text())
    assert [name for _, name in plays] == [
        "orch gate 0",
        "orch batch 0",
        "orch gate 1",
        "orch batch 1",
        "orch gate 2",
    ], plays
    assert len({pid for pid, _ in plays}) == 1, plays
    assert "roll incomplete: failed within --max-fail 1: web2; run again" in within.stdout
    assert states(plan) == {"web1": "completed", "web2": "failed", "web3": "completed"}
    assert production(web2) == "active"  # its compensation ran there
    board = run_orch("fleet", "status", plan)
    assert "failed within --max-fail 1: web2" in board.stdout, board.stdout


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_controller_killed_mid_roll_resumes_it_with_nothing_done_twice(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    inv = inventory(site, tmp_path, web2={"slow": 6})
    signalled_mid_install(plan, inv, web2, signal.SIGKILL)
    record = tmp_path / "plan" / ".orch" / "migrate.fleet.db"
    with sqlite3.connect(record) as db:  # what the controller had committed when it died
        recorded = dict(db.execute("SELECT host, state FROM hosts").fetchall())
    assert recorded == {"web1": "completed", "web2": "running", "web3": "pending"}

    resumed = run_orch(
        "fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "1", timeout=240
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert states(plan) == {"web1": "completed", "web2": "completed", "web3": "completed"}
    for h in site.hosts:
        assert done_log(h) == ["install", "bench"], h.name  # each step once, on every host
    sent = {h["host"]: h["sent"] for h in fleet_json(plan)["hosts"]}
    assert sent == {"web1": 1, "web2": 2, "web3": 1}


@pytest.mark.fleet
@pytest.mark.systemd
def test_an_unreachable_host_is_told_apart_and_stops_or_is_skipped(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    ghost = {"ansible_host": web1.ip, "ansible_port": 2, "orch_home": HOME}  # nothing listens
    inv = inventory(site, tmp_path, _extra={"ghost": ghost})
    doc = yaml.safe_load(inv.read_text())
    listed = doc["all"]["hosts"]
    doc["all"]["hosts"] = {n: listed[n] for n in ("web1", "ghost", "web2", "web3")}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))  # ghost in the first batch
    roll = ["fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "2"]
    stopped = run_orch(*roll, timeout=180)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "roll stopped: ghost unreachable" in stopped.stdout
    assert states(plan) == {
        "web1": "completed",
        "ghost": "unreachable",
        "web2": "pending",
        "web3": "pending",
    }
    skipped = run_orch(*roll, "--unreachable", "skip", timeout=180)
    assert skipped.returncode == 1, skipped.stdout + skipped.stderr
    assert "roll incomplete: unreachable, skipped: ghost" in skipped.stdout
    after = states(plan)
    assert after == {**after, "web2": "completed", "web3": "completed", "ghost": "unreachable"}
    assert fleet_json(plan)["hosts"][0]["sent"] == 1  # web1, done, was left alone
    board = run_orch("fleet", "status", plan).stdout
    assert "ghost  unreachable" in board
    assert "failed" not in {h["state"] for h in fleet_json(plan)["hosts"]}


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_host_with_another_orch_or_none_is_refused_and_named(site: Any, tmp_path: Path) -> None:
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    # web1's orch is this one with one line more: another build.
    other = site.folder / "other"  # where the hosts see it (their /tmp is their own)
    for package in ("orchestrator", "tasks"):
        shutil.copytree(Path(VENV).parent / package, other / package)
    patched = other / "orchestrator" / "core" / "status.py"
    patched.write_text(patched.read_text() + "# patched\n")
    fake = site.folder / "fake-venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text(f'#!/bin/sh\nPYTHONPATH={other} exec {sys.executable} "$@"\n')
    (fake / "python").chmod(0o755)
    inv = inventory(
        site, tmp_path, web1={"orch_venv": str(fake.parent)}, web2={"orch_venv": "/nowhere"}
    )
    done = run_orch("fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "3", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = {h["host"]: h for h in fleet_json(plan)["hosts"]}
    assert doc["web1"]["state"] == "refused"
    assert f"the controller's is {build_id()}" in doc["web1"]["detail"]
    assert doc["web2"]["state"] == "refused"
    assert doc["web2"]["detail"] == "no orch at /nowhere/bin/python (set orch_venv, or install it)"
    assert doc["web3"]["state"] == "completed"
    assert done_log(web1) == [] and production(web1) == "active"  # refused: nothing ran


@pytest.mark.fleet
@pytest.mark.systemd
def test_install_puts_this_orch_on_a_host_without_one_and_runs_there(
    site: Any, tmp_path: Path
) -> None:
    web1 = site.hosts[0]
    plan = tmp_path / "plan" / "migrate.yaml"
    venv = "/var/tmp/orch-venv"  # web1's own (private /var/tmp): it has no orch yet
    inv = inventory(site, tmp_path, web1={"orch_venv": venv})
    roll = ["fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "3", "--limit", "web1"]
    refused = run_orch(*roll, timeout=120)
    assert refused.returncode == 1 and f"no orch at {venv}/bin/python" in refused.stdout
    installed = run_orch(*roll, "--install", timeout=480)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"web1 has orch {build_id()}" in installed.stdout
    assert states(plan) == {"web1": "completed"}
    there = web1.run(
        [
            f"{venv}/bin/python",
            "-P",
            "-c",
            "from orchestrator.fleet.build import build_id; print(build_id())",
        ]
    )
    assert there.stdout.strip() == build_id(), there.stderr  # the same build, from its wheel
    assert not web1.private(f"{HOME}/.wheels-{build_id()}").exists()  # cleaned up
    web1.run(["rm", "-rf", venv])


@pytest.mark.fleet
@pytest.mark.systemd
def test_sigterm_stops_the_controller_not_the_hosts_and_the_next_run_collects_them(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan = tmp_path / "plan" / "migrate.yaml"
    inv = inventory(site, tmp_path, web1={"slow": 4})
    code, out, err = signalled_mid_install(plan, inv, web1, signal.SIGTERM)
    assert code == 130, out + err
    assert "interrupted" in out
    doc = fleet_json(plan)
    assert doc["roll"]["state"] == "interrupted"
    assert {h["host"]: h["state"] for h in doc["hosts"]} == {
        "web1": "running",
        "web2": "pending",
        "web3": "pending",
    }
    wait_for(lambda: done_log(web1) == ["install", "bench"], timeout=60, what="web1 to finish")

    # web3 leaves the inventory, web4 (web3's address under a new name) joins it.
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["hosts"]["web4"] = doc["all"]["hosts"].pop("web3")
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    resumed = run_orch("fleet", "run", plan, "-i", inv, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "new in the inventory go last: web4" in resumed.stdout
    assert states(plan) == {
        "web1": "completed",
        "web2": "completed",
        "web3": "removed",
        "web4": "completed",
    }
    assert done_log(web1) == ["install", "bench"]  # collected, not run again


SCRIPTED = """\
name: scripted
files: [scripts/*.sh]
tasks:
  - id: check
    kind: shell
    params: {command: ./scripts/check.sh}
"""


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_plan_runs_a_script_from_its_folder_sent_once_and_again_where_lost(
    site: Any, tmp_path: Path
) -> None:
    """The script travels with the plan (executable); the next roll sends it by digest alone,
    and the host that lost it asks for it and gets it."""
    web1, web2, web3 = site.hosts
    folder = tmp_path / "plan"
    (folder / "scripted.yaml").write_text(SCRIPTED)
    (folder / "scripts").mkdir()
    script = folder / "scripts" / "check.sh"
    script.write_text("#!/bin/sh\necho check >> /var/tmp/done.log\necho ::finding checked=1\n")
    script.chmod(0o755)
    inv = inventory(site, tmp_path)
    roll = ["fleet", "run", folder / "scripted.yaml", "-i", inv, "--canary", "0", "--serial", "3"]
    first = run_orch(*roll, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    for h in site.hosts:
        assert done_log(h) == ["check"], h.name
    on_web2 = web2.private(f"{HOME}/scripted/scripts/check.sh")
    assert on_web2.read_bytes() == script.read_bytes()
    on_web2.unlink()
    again = run_orch(*roll, "--new-roll", timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "web2 lacks 1 of the plan's files: sent" in again.stdout, again.stdout
    assert "web1 lacks" not in again.stdout and "web3 lacks" not in again.stdout
    assert on_web2.read_bytes() == script.read_bytes() and os.access(on_web2, os.X_OK)
    for h in site.hosts:
        assert done_log(h) == ["check"], h.name  # their stores say it is done: not run again


WAITS = """\
name: waits
tasks:
  - {id: first, kind: shell, params: {command: "true"}}
  - id: held
    kind: shell
    needs: [first]
    params: {command: "while [ ! -e /var/tmp/go ]; do sleep 0.2; done"}
  - {id: last, kind: shell, needs: [held], params: {command: "true"}}
"""


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_running_hosts_progress_is_on_the_board_while_it_runs(site: Any, tmp_path: Path) -> None:
    """A step that holds until told: the board says where each host is before any answers."""
    plan = tmp_path / "plan" / "waits.yaml"
    plan.write_text(WAITS)
    inv = inventory(site, tmp_path)
    controller = start_orch("fleet", "run", plan, "-i", inv, "--canary", "0", "--serial", "3")
    held = {"done": 1, "total": 3, "running": ["held"]}

    def all_held() -> bool:
        done = run_orch("fleet", "status", plan, "--json")
        hosts = json.loads(done.stdout)["hosts"] if done.returncode == 0 else []
        return bool(hosts) and all(h["progress"] == held for h in hosts)

    try:
        wait_for(all_held, timeout=60, what="each host's progress on the board")
        board = run_orch("fleet", "status", plan).stdout
        assert board.count("1/3 done, at held") == 3, board
        for h in site.hosts:
            h.run(["touch", "/var/tmp/go"])
        out, err = controller.communicate(timeout=120)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.communicate()
        for h in site.hosts:
            h.run(["rm", "-f", "/var/tmp/go"])
    assert controller.returncode == 0, out + err
    hosts = fleet_json(plan)["hosts"]
    assert [(h["state"], h["progress"]) for h in hosts] == [("completed", None)] * 3


UNDO = """\
name: undo
vars: {fail: false, slow: 0}
tasks:
  - id: stop_production
    kind: systemd.stop
    params: {unit: production.service}
    on_failure:
      id: restore_production
      kind: shell
      params:
        command: >-
          echo undo >> /var/tmp/done.log; sleep ${vars.slow};
          systemctl start production.service
  - id: install
    kind: shell
    needs: [stop_production]
    params: {command: "echo install >> /var/tmp/done.log; test ${vars.fail} = false"}
"""


def undo_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan" / "undo.yaml"
    plan.write_text(UNDO)
    return plan


def stopped_roll(site: Any, tmp_path: Path) -> tuple[Path, Path]:
    """web1 and web2 migrated, web3 failed (and put back by its own compensation): stopped."""
    plan = undo_plan(tmp_path)
    inv = inventory(site, tmp_path, web3={"fail": True}, web2={"slow": 6})
    rolled = run_orch("fleet", "run", plan, "-i", inv, "--canary", "0", timeout=240)
    assert rolled.returncode == 1, rolled.stdout + rolled.stderr
    assert [production(h) for h in site.hosts] == ["inactive", "inactive", "active"]
    return plan, inv


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_rollback_puts_back_a_stopped_rolls_hosts_last_batch_first(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan, inv = stopped_roll(site, tmp_path)
    back = run_orch("fleet", "rollback", plan, "-i", inv, "--canary", "0", timeout=240)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "rollback #2 of roll #1: 3 hosts, the last batch first, no canary" in back.stdout
    assert [production(h) for h in site.hosts] == ["active"] * 3
    assert [done_log(h) for h in site.hosts] == [["install", "undo"]] * 2 + [["install", "undo"]]
    doc = fleet_json(plan)
    assert doc["roll"]["rollback_of"] == 1 and doc["roll"]["state"] == "completed"
    # The last batch first: batches run in their order (test_fleet_gates.py), each host
    # started no sooner than the one before (the record's times are to the second).
    batch = {h["host"]: h["batch"] for h in doc["hosts"]}
    assert batch == {"web3": 0, "web2": 1, "web1": 2}, batch
    started = {h["host"]: h["started_at"] for h in doc["hosts"]}
    assert started["web3"] <= started["web2"] <= started["web1"], started
    board = run_orch("fleet", "status", plan).stdout
    assert "undo · rollback #2 of roll #1 completed · 3/3 hosts completed" in board, board
    first = run_orch("fleet", "status", plan, "--roll", "1", "--json")
    assert json.loads(first.stdout)["roll"]["detail"] == "rolled back by roll #2"
    report = run_orch("report", plan, "--fleet", "--json")
    assert "rollback of roll #1" in Path(json.loads(report.stdout)["report"]).read_text()
    again = run_orch("fleet", "rollback", plan, "-i", inv, timeout=60)
    assert again.returncode == 2 and "is itself a rollback" in again.stderr, again.stderr
    forward = run_orch("fleet", "run", plan, "-i", inv, "--canary", "0", timeout=240)
    assert "roll #3 of undo" in forward.stdout, forward.stdout  # a roll forward begins anew


@pytest.mark.fleet
@pytest.mark.systemd
def test_a_controller_killed_mid_rollback_resumes_it_with_each_step_once(
    site: Any, tmp_path: Path
) -> None:
    web1, web2, web3 = site.hosts
    plan, inv = stopped_roll(site, tmp_path)
    back = ["fleet", "rollback", plan, "-i", inv, "--canary", "0"]
    controller = start_orch(*back)
    try:
        wait_for(lambda: done_log(web2) == ["install", "undo"], timeout=120, what="web2 undoes")
        os.killpg(controller.pid, signal.SIGKILL)  # orch, ansible-playbook and ssh
        controller.communicate(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.communicate()
    resumed = run_orch(*back, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming rollback #2" in resumed.stdout, resumed.stdout
    assert [production(h) for h in site.hosts] == ["active"] * 3
    for h in site.hosts:
        assert done_log(h) == ["install", "undo"], h.name  # each compensation once
