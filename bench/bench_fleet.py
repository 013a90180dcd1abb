"""Fleet benchmark: `orch fleet run` of a trivial plan over N hosts, against Ansible alone
running the same commands over the same hosts, measured in the same run.

    .venv/bin/python bench/bench_fleet.py [--hosts 50] [--serial 10] [--rounds 3] [--json]

Needs root, iproute2 and openssh-server: the hosts are tests/fleet_hosts.py's bare hosts (a
network namespace and an sshd each, sharing this machine's file system and CPUs), reached by
Ansible over real SSH exactly as remote machines would be.

What is compared, each round (a new roll, new hosts' homes, so every host really runs it):

- orch: `orch fleet run PLAN -i INVENTORY --canary 0 --serial 10`, PLAN being two `shell`
  tasks (`echo ::finding n=1`, then `true`). orch runs one ansible-playbook a roll through
  ansible-runner: a gate play on the controller before each batch (the batch committed
  `running` in the record), then the batch's play, one `orch_host` task per host starting
  orch's host command over Ansible's connection (`<orch_venv>/bin/python -P -m
  orchestrator.fleet.host`), which runs the plan in the host's own store and answers in JSON;
  the controller records every host in its SQLite record as its answer comes.
- Ansible alone: `ansible-playbook` of one play with `serial: 10` and `forks 10`, one
  `command` task per host running the same commands (`bash --norc -eo pipefail -c 'echo ::finding
  n=1; true'`, as orch's shell kind runs them), with the environment orch gives Ansible
  (orchestrator.fleet.ansible.ansible_env()) and the same inventory.
- Both arms: the same forks (the batch size), pipelining, SSH options (ControlPersist), no
  fact gathering, set in SHARED below and printed in the head, and the same Python on the
  hosts (HOST_PYTHON): Ansible's modules run under it, and orch from a venv it made, installed
  once before the rounds by orch's own `orch fleet run --install` (its wheels built here), as
  on a real fleet. The controller's editable checkout under pyenv's Python (no PGO) costs
  ~20% more CPU a start: on the hosts it would charge orch's arm alone.
- A third column, unless --no-mitogen: both arms again with Mitogen's strategy
  (`mitogen_linear`: one persistent interpreter a host), installed into bench/.mitogen with
  pip on first use (never into orch's venv); said and left out when it cannot be had.

The rounds alternate the order (orch, ansible, ansible, orch, ...) so drift hits both alike;
an untimed Ansible run first warms SSH, the page cache and the hosts' Python. Every orch run
must exit 0 with every host `completed` (its two tasks done, the finding reported) in
`orch fleet status --json`, and every Ansible run must report no failed or unreachable host:
otherwise the bench stops with an error (a timing of a failed roll means nothing).

The goal: orch adds at most 10% to what Ansible alone takes (median orch / median Ansible
≤ 1.10); said met or not, the exit status stays 0. The breakdown under it explains the
difference: the time outside the batches (process start, `ansible-inventory --list`, the
record), each batch's span (orch's from its record, Ansible's from its `PLAY [` headers), what
an ansible-playbook process (and ansible-runner around it) costs before any task, the host
command alone run here against the bare bash command (wall and CPU), and the CPU each run used:
the controller's processes and the whole machine's (the hosts share its cores).
"""

from __future__ import annotations

import argparse
import base64
import compileall
import json
import math
import os
import re
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.fleet.ansible import ansible_env, ansible_tool
from orchestrator.fleet.build import build_id
from orchestrator.fleet.folder import collect, entries
from orchestrator.kinds.builtins import BASH

BENCH_DIR = Path(__file__).resolve().parent
CHECKOUT = BENCH_DIR.parent
SCRATCH_PARENT = CHECKOUT / ".sandbox"  # git-ignored; nothing goes to /tmp
PYTHON = sys.executable
ORCH = str(Path(PYTHON).with_name("orch"))
# The hosts' Python, for both arms: Ansible's modules run under it (ansible_python_interpreter,
# set, not discovered), and orch runs from a venv it made, as `orch fleet run --install` makes
# one on a real host (orch_python). Not the controller's venv: an editable checkout under
# another build of Python (here pyenv's, without PGO) would charge orch's arm alone for both.
HOST_PYTHON = "/usr/bin/python3"
GOAL = 1.10  # orch adds at most 10%
PLAN_NAME = "fleetbench"
COMMANDS = ("echo ::finding n=1", "true")  # the plan's two tasks, in order
# Both as one command, as orch's shell kind runs a command string: what Ansible alone runs.
COMMAND_ARGV = [*BASH, "; ".join(COMMANDS)]
PLAN = f"""\
name: {PLAN_NAME}
tasks:
  - {{id: find, kind: shell, params: {{command: "{COMMANDS[0]}"}}}}
  - {{id: done, kind: shell, needs: [find], params: {{command: "{COMMANDS[1]}"}}}}
"""
# What both arms share, set here for both: forks (= the batch size), pipelining, SSH's
# connection reuse, no fact gathering (both plays say `gather_facts: false`).
# SSH connection reuse as Ansible's defaults have it, its sockets in the bench's scratch (the
# test fleet's inventory turns it off: a master outliving a test would answer for whichever
# host next takes the address); the inventory's ansible_ssh_args, for both arms.
SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=60s -o ControlPath={scratch}/cp/%C"
SHARED = {
    "ANSIBLE_PIPELINING": "True",
    "ANSIBLE_GATHERING": "explicit",
    "ANSIBLE_HOST_KEY_CHECKING": "False",  # as the inventory's ssh options say (Mitogen reads this)
}
MITOGEN = BENCH_DIR / ".mitogen"  # `pip install --target` once: never in orch's venv


def mitogen_env(say: Callable[[str], None]) -> dict[str, str] | None:
    """Ansible's settings for Mitogen's strategy (its `strategy_plugins` folder puts the
    package on Ansible's path itself), installed into bench/.mitogen on first use; None when
    it cannot be had (no registry) or does not load with this ansible-core."""
    strategy = MITOGEN / "ansible_mitogen" / "plugins" / "strategy"
    if not strategy.is_dir():
        say("installing Mitogen into bench/.mitogen (once) ...")
        got = subprocess.run(
            [PYTHON, "-m", "pip", "install", "-q", "--target", str(MITOGEN), "mitogen"],
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode != 0 or not strategy.is_dir():
            say(f"no Mitogen column: pip said {got.stderr.strip()[-300:]}")
            return None
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategy), "ANSIBLE_STRATEGY": "mitogen_linear"}


# The design's fixed parts on a host, and nothing of orch's: pydantic validating a plan read by
# libyaml, structlog imported, a SQLite store in WAL committing (and syncing) each status change,
# the two commands run. What any host step built on orch's fixed libraries pays at least.
FIXED_PARTS = f"""
import sqlite3, subprocess, sys
import structlog, yaml
from pydantic import BaseModel
class Task(BaseModel):
    id: str
    kind: str
    needs: list[str] = []
    params: dict[str, str] = {{}}
class Plan(BaseModel):
    name: str
    tasks: list[Task]
plan = Plan.model_validate(yaml.load({PLAN!r}, Loader=yaml.CSafeLoader))
structlog.get_logger()
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE todos (id TEXT PRIMARY KEY, status TEXT)")
for t in plan.tasks:
    db.execute("INSERT INTO todos VALUES (?, 'in_progress')", (t.id,))
    subprocess.run([*{BASH!r}, t.params["command"]], stdin=subprocess.DEVNULL,
                   capture_output=True, start_new_session=True, check=True)
    db.execute("UPDATE todos SET status = 'completed' WHERE id = ?", (t.id,))
"""


def ansible_module(scratch: Path, env: dict[str, str]) -> Path:
    """The `command` module exactly as Ansible sends it for the Ansible arm's task (its
    AnsiballZ wrapper, the arguments inside), kept by ANSIBLE_KEEP_REMOTE_FILES from one local
    run: to time on its own, under HOST_PYTHON."""
    tmp = scratch / "module"
    argv = [ansible_tool("ansible"), "localhost", "-c", "local", "-m", "ansible.builtin.command"]
    argv += ["-a", json.dumps({"argv": COMMAND_ARGV})]
    argv += ["-e", f"ansible_python_interpreter={HOST_PYTHON}"]
    keep = {"ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_REMOTE_TMP": str(tmp)}
    check(argv, "ansible localhost -m command", cwd=scratch, env={**env, **keep})
    found = sorted(tmp.rglob("AnsiballZ_command.py"))
    if len(found) != 1:
        raise BenchError(f"{tmp}: {len(found)} AnsiballZ_command.py kept, not 1")
    return found[0]


RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """Something failed: the timing would mean nothing. Said, exit status 1."""


@dataclass
class Row:
    section: str
    figure: str
    value: float
    unit: str
    note: str = ""


@dataclass
class Run:
    """One timed run: its wall time, the CPU seconds of the controller's processes (the
    command and its children) and of the whole machine (hosts included), its batches' spans."""

    tool: str
    wall_s: float
    controller_cpu_s: float
    machine_cpu_s: float
    batches_s: list[float] = field(default_factory=list)

    @property
    def outside_s(self) -> float:
        """Time outside the batches: start-up, inventory, record, exit."""
        return self.wall_s - sum(self.batches_s)


# --- measuring ---------------------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy (all cores, every process), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@contextmanager
def metered() -> Iterator[dict[str, float]]:
    """Wall, controller CPU (children waited for inside) and machine CPU of the block."""
    out: dict[str, float] = {}
    cpu0, busy0, t0 = children_cpu_s(), machine_busy_s(), time.perf_counter()
    yield out
    out["wall_s"] = time.perf_counter() - t0
    out["controller_cpu_s"] = children_cpu_s() - cpu0
    out["machine_cpu_s"] = machine_busy_s() - busy0


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def check(argv: Sequence[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-3000:]
        raise BenchError(f"{what}: `{' '.join(map(str, argv))}` exited {done.returncode}:\n{said}")
    return done


def _count_runs(store: Path) -> int | str:
    """How many runs a host's store holds ("no store" when there is none)."""
    if not store.is_file():
        return "no store"
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])


# --- the two tools ------------------------------------------------------------------------------


class Bench:
    def __init__(self, scratch: Path, hosts: int, serial: int, env: dict[str, str]) -> None:
        self.scratch = scratch
        self.n = hosts
        self.serial = serial
        self.env = env  # orch's (and through it Ansible's, ansible_env()); cwd: scratch
        self.ansible_env = {**ansible_env(), **SHARED}
        if "ANSIBLE_CONFIG" not in env:  # orch runs in `scratch`, where no ansible.cfg is
            self.ansible_env.pop("ANSIBLE_CONFIG", None)
        self.batches = math.ceil(hosts / serial)
        self.fleet: Any = None
        self.names: list[str] = []
        self.inventory = scratch / "ansible" / "hosts.yml"
        self.playbook = scratch / "ansible" / "play.yml"
        self.orch_rounds = 0

    @property
    def host_venv(self) -> Path:
        """orch on the hosts: one venv (the bare hosts share this file system), made by
        install_on_hosts() with orch's own `--install`."""
        return self.scratch / "host-venv"

    def write_inventory(self, path: Path, homes: Path) -> Path:
        """The fleet's inventory: each host's own orch_home under `homes`; orch in host_venv;
        HOST_PYTHON for Ansible's modules and orch's venv alike."""
        path.parent.mkdir(parents=True, exist_ok=True)
        host_vars = {name: {"orch_home": str(homes / name)} for name in self.names}
        group = {
            "orch_venv": str(self.host_venv),
            "orch_python": HOST_PYTHON,
            "ansible_python_interpreter": HOST_PYTHON,
            "ansible_ssh_args": SSH_ARGS.format(scratch=self.scratch),
        }
        return Path(self.fleet.inventory(path, host_vars, group))

    def new_roll(self, here: Path) -> tuple[Path, Path, list[str]]:
        """A new plan folder under `here` (so a new record) and new hosts' homes (so every
        host runs the plan, none finds it done): the plan, the homes, and `orch fleet run`'s
        argv over them with no canary."""
        plan = here / "plan" / f"{PLAN_NAME}.yaml"
        plan.parent.mkdir(parents=True)
        plan.write_text(PLAN)
        homes = here / "homes"
        inventory = self.write_inventory(here / "hosts.yml", homes)
        return plan, homes, [ORCH, "fleet", "run", str(plan), "-i", str(inventory), "--canary", "0"]

    def install_on_hosts(self) -> float:
        """`orch fleet run --install` over the first host: the controller builds its wheels,
        and that host makes host_venv with HOST_PYTHON and installs them (the others share
        it). Untimed in the rounds; its wall time is returned."""
        _, _, argv = self.new_roll(self.scratch / "install")
        argv += ["--install", "-l", self.names[0]]
        t0 = time.perf_counter()
        check(argv, "orch fleet run --install", cwd=self.scratch, env=self.env)
        return time.perf_counter() - t0

    def write_ansible(self) -> None:
        self.write_inventory(self.inventory, self.scratch / "ansible" / "homes")
        play = [
            {
                "name": "bench",
                "hosts": "all",
                "gather_facts": False,
                "serial": self.serial,
                "tasks": [
                    {
                        "name": "the plan's commands",
                        "ansible.builtin.command": {"argv": COMMAND_ARGV},
                        "changed_when": True,
                    }
                ],
            }
        ]
        self.playbook.write_text(json.dumps(play, indent=1) + "\n")  # JSON is YAML
        empty = [{"name": "empty", "hosts": "all", "gather_facts": False, "tasks": []}]
        (self.scratch / "ansible" / "empty.yml").write_text(json.dumps(empty) + "\n")

    # --- Ansible alone ---------------------------------------------------------------------

    def run_ansible(self, extra: dict[str, str] | None = None) -> Run:
        argv = [
            ansible_tool("ansible-playbook"),
            "-i",
            str(self.inventory),
            "-f",
            str(self.serial),
            str(self.playbook),
        ]
        marks: list[tuple[float, str]] = []  # when each `PLAY [` / `PLAY RECAP` line came
        lines: list[str] = []
        with metered() as m:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                argv,
                cwd=self.scratch,
                env={**self.ansible_env, **(extra or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
            assert proc.stdout is not None
            for line in proc.stdout:  # Ansible's display flushes every line
                lines.append(line)
                if line.startswith(("PLAY [", "PLAY RECAP")):
                    marks.append((time.perf_counter() - t0, line))
            rc = proc.wait()
        text = "".join(lines)
        if rc != 0:
            raise BenchError(f"ansible-playbook exited {rc}:\n{text[-3000:]}")
        recap = {
            m.group(1): [int(g) for g in m.groups()[1:]]
            for m in map(RECAP.match, text.split("PLAY RECAP")[-1].splitlines())
            if m
        }
        bad = {h: v for h, v in recap.items() if v[0] != 1 or v[2] or v[3]}
        if sorted(recap) != sorted(self.names) or bad:
            raise BenchError(
                f"ansible-playbook: not every host ran the task once without failure "
                f"(recap of {len(recap)} hosts; not ok: {bad or 'none'}):\n{text[-3000:]}"
            )
        plays = [t for t, line in marks if line.startswith("PLAY [")]
        ends = [t for t, line in marks if line.startswith("PLAY RECAP")]
        if len(plays) != self.batches or len(ends) != 1:
            raise BenchError(
                f"ansible-playbook: {len(plays)} `PLAY [` headers, not one per batch "
                f"({self.batches}):\n{text[-3000:]}"
            )
        edges = [*plays, ends[0]]
        spans = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        return Run(
            "ansible" + (" mitogen" if extra else ""),
            m["wall_s"],
            m["controller_cpu_s"],
            m["machine_cpu_s"],
            spans,
        )

    # --- orch --------------------------------------------------------------------------------

    def run_orch(self, extra: dict[str, str] | None = None) -> Run:
        self.orch_rounds += 1
        plan, homes, argv = self.new_roll(self.scratch / f"orch{self.orch_rounds}")
        argv += ["--serial", str(self.serial)]
        with metered() as m:
            done = subprocess.run(
                argv,
                cwd=self.scratch,
                env={**self.env, **(extra or {})},
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        if done.returncode != 0:
            raise BenchError(
                f"orch fleet run exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
            )
        self.verify_roll(plan, homes)
        spans = self.orch_batches(plan.parent / ".orch" / f"{PLAN_NAME}.fleet.db")
        return Run(
            "orch" + (" mitogen" if extra else ""),
            m["wall_s"],
            m["controller_cpu_s"],
            m["machine_cpu_s"],
            spans,
        )

    def verify_roll(self, plan: Path, homes: Path) -> None:
        """`orch fleet status --json`: one completed roll, every host completed, both tasks
        done there with the finding; and each host's own store, in its own home, holding
        exactly one run (the plan ran there once, in this roll)."""
        argv = [ORCH, "fleet", "status", str(plan), "--json"]
        status = check(argv, "orch fleet status", cwd=self.scratch, env=self.env)
        doc = json.loads(status.stdout)
        problems = []
        if doc["roll"]["state"] != "completed" or doc["roll"]["id"] != 1:
            problems.append(f"roll #{doc['roll']['id']} is {doc['roll']['state']}")
        seen = [h["host"] for h in doc["hosts"]]
        if sorted(seen) != sorted(self.names):
            problems.append(f"the record holds {len(seen)} hosts, not the {self.n}")
        for h in doc["hosts"]:
            tasks = {t["id"]: t for t in h["tasks"]}
            found = [(f["key"], f["value"]) for f in tasks.get("find", {}).get("findings", [])]
            if (
                h["state"] != "completed"
                or [t["status"] for t in h["tasks"]] != ["completed", "completed"]
                or found != [("n", 1)]
            ):
                problems.append(f"{h['host']}: {h['state']} ({h['detail']})")
                continue
            store = homes / h["host"] / PLAN_NAME / ".orch" / f"{PLAN_NAME}.db"
            runs = _count_runs(store)
            if runs != 1:
                problems.append(f"{h['host']}: {runs} runs in its store {store}, not 1")
        if problems:
            raise BenchError("orch's roll did not complete on every host:\n" + "\n".join(problems))

    def orch_batches(self, record: Path) -> list[float]:
        """Each batch's span from the record: its hosts recorded `running` (committed before
        ansible-runner starts) to the last host's answer recorded."""
        with closing(sqlite3.connect(f"file:{record}?mode=ro", uri=True)) as db:
            rows = db.execute(
                "SELECT h.batch, m.state, m.at FROM moves m JOIN hosts h"
                " ON h.roll_id = m.roll_id AND h.host = m.host"
            ).fetchall()
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}
        for batch, state, at in rows:
            if state == "running":
                starts[batch] = min(at, starts.get(batch, at))
            else:
                ends[batch] = max(at, ends.get(batch, at))
        if sorted(starts) != list(range(self.batches)) or sorted(ends) != sorted(starts):
            raise BenchError(f"{record}: batches {sorted(starts)}, not {self.batches}")
        return [ends[b] - starts[b] for b in sorted(starts)]

    # --- the parts, alone --------------------------------------------------------------------

    def parts(self, reps: int) -> dict[str, dict[str, float]]:
        """Median wall (and CPU) of what a roll is made of, each alone, round robin."""
        empty = str(self.scratch / "ansible" / "empty.yml")
        inv = str(self.inventory)
        runner = self.scratch / "runner"
        runner.mkdir()
        run_empty = (
            "import sys, ansible_runner\n"
            "from orchestrator.fleet.ansible import ansible_env\n"
            "r = ansible_runner.run(private_data_dir=sys.argv[1], playbook=sys.argv[2],"
            " inventory=sys.argv[3], limit=sys.argv[4], forks=int(sys.argv[5]),"
            " envvars=ansible_env(), quiet=True)\n"
            "sys.exit(0 if r.rc == 0 else 1)\n"
        )
        batch = ",".join(self.names[: self.serial])
        homes = self.scratch / "local-homes"
        count = iter(range(10**6))
        host_python = str(self.host_venv / "bin" / "python")  # as the hosts run it

        def host_command() -> list[str]:
            return [host_python, "-P", "-m", "orchestrator.fleet.host"]

        plan_file = self.scratch / "local-plan" / f"{PLAN_NAME}.yaml"
        plan_file.parent.mkdir()
        homes.mkdir()
        plan_file.write_text(PLAN)
        files = entries(collect(plan_file, None), {})  # sent whole, as a host's first roll has

        def host_stdin() -> str:
            doc = {
                "build": build_id(),
                "plan": {"name": PLAN_NAME, "file": plan_file.name, "files": files},
                "vars": [],
                "home": str(homes / f"h{next(count)}"),  # fresh: the plan really runs
                "approve": [],
                "wait_s": 60,
                "argv": ["orch", "fleet", "run", f"{PLAN_NAME}.yaml", "(bench)"],
            }
            return base64.b64encode(json.dumps(doc).encode()).decode()

        inventory_cmd = [ansible_tool("ansible-inventory"), "-i", inv, "--list"]
        playbook_cmd = [ansible_tool("ansible-playbook"), "-i", inv, "-f", str(self.serial)]
        playbook_cmd += ["-l", batch, empty]
        runner_cmd = [PYTHON, "-c", run_empty, str(runner), empty, inv, batch, str(self.serial)]
        module = str(ansible_module(self.scratch, self.ansible_env))

        def fixed_parts() -> list[str]:
            return [host_python, "-P", "-c", FIXED_PARTS, str(homes / f"fixed{next(count)}.db")]

        cases: list[tuple[str, Callable[[], list[str]], Callable[[], str], dict[str, str]]] = [
            ("python -P -c pass", lambda: [host_python, "-P", "-c", "pass"], str, self.env),
            ("bash command alone", lambda: COMMAND_ARGV, str, self.env),
            ("host command alone", host_command, host_stdin, self.env),
            ("ansible's command module alone", lambda: [HOST_PYTHON, module], str, self.env),
            ("the fixed parts alone", fixed_parts, str, self.env),
            ("ansible-inventory --list", lambda: inventory_cmd, str, self.ansible_env),
            ("ansible-playbook, no task", lambda: playbook_cmd, str, self.ansible_env),
            ("ansible-runner, no task", lambda: runner_cmd, str, self.env),
        ]
        samples: dict[str, dict[str, list[float]]] = {c[0]: {"wall": [], "cpu": []} for c in cases}
        for _ in range(reps):
            for label, argv, stdin, env in cases:
                args, given = argv(), stdin()
                with metered() as m:
                    done = subprocess.run(
                        args,
                        input=given,
                        env=env,
                        cwd=self.scratch,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                unanswered = label == "host command alone" and '"completed"' not in done.stdout
                if done.returncode != 0 or unanswered:
                    raise BenchError(
                        f"{label}: exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}"
                    )
                samples[label]["wall"].append(m["wall_s"])
                samples[label]["cpu"].append(m["controller_cpu_s"])
        shutil.rmtree(runner, ignore_errors=True)
        return {
            label: {"wall_s": median(s["wall"]), "cpu_s": median(s["cpu"])}
            for label, s in samples.items()
        }


# --- the report -----------------------------------------------------------------------------------


def figures(
    runs: list[tuple[Run, Run]],
    parts: dict[str, dict[str, float]],
    bench: Bench,
    with_mitogen: list[tuple[Run, Run]],
) -> tuple[list[Row], dict[str, Any]]:
    orch = [o for o, _ in runs]
    ans = [a for _, a in runs]
    o_wall, a_wall = median([r.wall_s for r in orch]), median([r.wall_s for r in ans])
    ratio = o_wall / a_wall
    o_batch = median([s for r in orch for s in r.batches_s])
    a_batch = median([s for r in ans for s in r.batches_s])
    o_out, a_out = median([r.outside_s for r in orch]), median([r.outside_s for r in ans])
    n, k, cores = bench.n, bench.batches, os.cpu_count() or 1
    host, bash = parts["host command alone"], parts["bash command alone"]
    runner, playbook = parts["ansible-runner, no task"], parts["ansible-playbook, no task"]
    module, fixed = parts["ansible's command module alone"], parts["the fixed parts alone"]
    extra_cpu = host["cpu_s"] - module["cpu_s"]
    rows = [
        Row("whole roll", "orch fleet run, median", o_wall, "s"),
        Row("whole roll", "ansible-playbook, median", a_wall, "s"),
        Row(
            "whole roll",
            "  difference",
            o_wall - a_wall,
            "s",
            f"{(o_wall - a_wall) / n:.3f} s/host",
        ),
        Row(
            "whole roll",
            "  ratio orch/ansible",
            ratio,
            "x",
            f"goal ≤{GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'}",
        ),
        Row("outside the batches", "orch: start, ansible-inventory, record, exit", o_out, "s"),
        Row("outside the batches", "ansible: start, inventory, play, exit", a_out, "s"),
        Row(
            "outside the batches",
            "  ansible-inventory --list, alone",
            parts["ansible-inventory --list"]["wall_s"],
            "s",
            "orch runs it once a roll",
        ),
        Row(
            "per batch",
            f"orch, median of {k} x {len(orch)}",
            o_batch,
            "s",
            "record: `running` committed → last answer recorded",
        ),
        Row(
            "per batch",
            f"ansible, median of {k} x {len(ans)}",
            a_batch,
            "s",
            "`PLAY [` header → the next (or the recap)",
        ),
        Row(
            "per batch",
            "  difference",
            o_batch - a_batch,
            "s",
            f"x {k} batches = {(o_batch - a_batch) * k:.2f} s",
        ),
        Row(
            "per batch",
            f"  ansible-playbook, a play with no task ({bench.serial} hosts)",
            playbook["wall_s"],
            "s",
            "each arm pays it once a roll",
        ),
        Row(
            "per batch",
            "  ansible-runner around that play (python, runner, playbook)",
            runner["wall_s"],
            "s",
            f"+{runner['wall_s'] - playbook['wall_s']:.2f} s over the bare play",
        ),
        Row("per host", "python -P -c pass, here", parts["python -P -c pass"]["wall_s"], "s"),
        Row(
            "per host",
            "bash command alone, here",
            bash["wall_s"],
            "s",
            f"cpu {bash['cpu_s']:.3f} s",
        ),
        Row(
            "per host",
            "orch host command alone, here (plan run, fresh home)",
            host["wall_s"],
            "s",
            f"cpu {host['cpu_s']:.3f} s",
        ),
        Row(
            "per host",
            "ansible's command module alone (its AnsiballZ), here",
            module["wall_s"],
            "s",
            f"cpu {module['cpu_s']:.3f} s: what Ansible alone runs on a host",
        ),
        Row(
            "per host",
            "the design's fixed parts alone (pydantic, yaml, structlog, sqlite)",
            fixed["wall_s"],
            "s",
            f"cpu {fixed['cpu_s']:.3f} s: no orch, the same plan and store",
        ),
        Row(
            "per host",
            f"  host command over the module, x {bench.serial} hosts / {cores} cores",
            extra_cpu * bench.serial / cores,
            "s",
            "what it adds to a batch here",
        ),
        Row(
            "per host",
            f"  fixed parts over the module, x {bench.serial} hosts / {cores} cores",
            (fixed["cpu_s"] - module["cpu_s"]) * bench.serial / cores,
            "s",
            "a floor for any host step on these libraries",
        ),
        Row(
            "cpu",
            "orch: controller's processes, median",
            median([r.controller_cpu_s for r in orch]),
            "cpu-s",
            "orch, ansible-inventory, one ansible-playbook",
        ),
        Row(
            "cpu",
            "ansible: controller's processes, median",
            median([r.controller_cpu_s for r in ans]),
            "cpu-s",
        ),
        Row(
            "cpu",
            "orch: whole machine (hosts' sshd, python, commands too)",
            median([r.machine_cpu_s for r in orch]),
            "cpu-s",
        ),
        Row("cpu", "ansible: whole machine", median([r.machine_cpu_s for r in ans]), "cpu-s"),
    ]
    mitogen = None
    if with_mitogen:
        m_orch = median([o.wall_s for o, _ in with_mitogen])
        m_ans = median([a.wall_s for _, a in with_mitogen])
        mitogen = {"orch_median_s": m_orch, "ansible_median_s": m_ans, "ratio": m_orch / m_ans}
        note = f"goal ≤{GOAL:.2f}: {'met' if m_orch / m_ans <= GOAL else 'NOT met'}"
        rows += [
            Row("with Mitogen, both arms", "orch fleet run, median", m_orch, "s"),
            Row("with Mitogen, both arms", "ansible-playbook, median", m_ans, "s"),
            Row("with Mitogen, both arms", "  ratio orch/ansible", m_orch / m_ans, "x", note),
        ]
    doc = {
        "hosts": n,
        "serial": bench.serial,
        "batches": k,
        "cpus": cores,
        "rounds": [
            {
                "orch": asdict(o) | {"outside_s": o.outside_s},
                "ansible": asdict(a) | {"outside_s": a.outside_s},
            }
            for o, a in runs
        ],
        "orch_median_s": o_wall,
        "ansible_median_s": a_wall,
        "ratio": ratio,
        "goal": GOAL,
        "met": ratio <= GOAL,
        "parts": parts,
        "mitogen": mitogen,  # None: not run (--no-mitogen, or it could not be had)
        "rows": [asdict(r) for r in rows],
    }
    return rows, doc


def render(rows: list[Row], runs: list[tuple[Run, Run]], orders: list[str], head: str) -> str:
    out = [head, "", "[rounds]"]
    out.append(f"{'round':<6} {'order':<14} {'orch s':>8} {'ansible s':>10} {'ratio':>6}")
    for i, ((o, a), order) in enumerate(zip(runs, orders, strict=True), 1):
        out.append(
            f"{i:<6} {order:<14} {o.wall_s:>8.2f} {a.wall_s:>10.2f} {o.wall_s / a.wall_s:>6.2f}"
        )
    section = ""
    for r in rows:
        if r.section != section:
            section = r.section
            out += ["", f"[{section}]"]
        value = f"{r.value:.2f}" if r.unit in ("x", "s", "cpu-s") else f"{r.value:.3f}"
        out.append(f"{r.figure:<62} {value:>8} {r.unit:<5}  {r.note}".rstrip())
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------------------


@contextmanager
def _ssh_masters_ended(sockets: Path) -> Iterator[None]:
    """The SSH masters (ControlPersist) whose sockets are in `sockets`: ended after the block."""
    try:
        yield
    finally:
        subprocess.run(["pkill", "-f", f"{sockets}/"], check=False)


def bench(args: argparse.Namespace, scratch: Path, say: Callable[[str], None]) -> dict[str, Any]:
    sys.path.insert(0, str(CHECKOUT / "tests"))
    from fleet_hosts import fleet

    for package in ("orchestrator", "tasks"):  # bytecode, as pip writes an installed package's
        compileall.compile_dir(str(CHECKOUT / package), quiet=1)
    env = {**os.environ, "NO_COLOR": "1", **SHARED}  # orch passes it on to its Ansible
    load = os.getloadavg()
    head = (
        f"orch fleet bench: {args.hosts} bare hosts (netns + sshd) on this machine,"
        f" --serial {args.serial} --canary 0, {args.rounds} rounds; python"
        f" {sys.version.split()[0]}, {os.cpu_count()} CPUs, load before"
        f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; build {build_id()}\n"
        f"both arms: forks {args.serial}, pipelining on, ssh {SSH_ARGS.format(scratch='…')},"
        f" no facts gathered, {HOST_PYTHON} on the hosts"
    )
    say(head)
    t0 = time.perf_counter()
    (scratch / "cp").mkdir()  # SSH's control sockets: masters ended before the fleet is
    with fleet(args.hosts, systemd=False, prefix="web") as f, _ssh_masters_ended(scratch / "cp"):
        say(f"fleet up in {time.perf_counter() - t0:.1f}s")
        b = Bench(scratch, args.hosts, args.serial, env)
        b.fleet, b.names = f, [h.name for h in f.hosts]
        b.write_ansible()
        took = b.install_on_hosts()
        say(f"orch installed on the hosts (--install, {HOST_PYTHON}) in {took:.1f}s")
        mitogen = None if args.no_mitogen else mitogen_env(say)
        warm = b.run_ansible()  # untimed: SSH, the page cache, the hosts' Python
        say(f"warm-up ansible run: {warm.wall_s:.2f}s")
        if mitogen:
            say(f"warm-up ansible run with Mitogen: {b.run_ansible(mitogen).wall_s:.2f}s")
        runs: list[tuple[Run, Run]] = []
        with_mitogen: list[tuple[Run, Run]] = []
        orders = []
        for i in range(args.rounds):
            first_orch = i % 2 == 0
            for extra, into in ((None, runs), (mitogen, with_mitogen)):
                if extra is None and into is with_mitogen:
                    continue
                got: dict[str, Run] = {}
                for tool in ("orch", "ansible") if first_orch else ("ansible", "orch"):
                    got[tool] = b.run_orch(extra) if tool == "orch" else b.run_ansible(extra)
                    say(f"round {i + 1}: {got[tool].tool} {got[tool].wall_s:.2f}s")
                into.append((got["orch"], got["ansible"]))
            orders.append("orch, ansible" if first_orch else "ansible, orch")
        say("the parts alone ...")
        parts = b.parts(args.reps)
    rows, doc = figures(runs, parts, b, with_mitogen)
    doc["load_before"] = load
    doc["load_after"] = os.getloadavg()
    doc["build"] = build_id()
    doc["build_changed"] = build_id.__wrapped__() != build_id()
    text = render(rows, runs, orders, head)
    if doc["build_changed"]:  # someone edited the checkout: the rounds may differ in code
        text += f"\nnote: orch's source changed during the bench (now {build_id.__wrapped__()})"
    doc["text"] = text
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50, help="bare hosts (default 50)")
    parser.add_argument("--serial", type=int, default=10, help="hosts a batch, = forks (10)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of both (3)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each part (3)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--no-mitogen", action="store_true", help="no third column (both arms with Mitogen)"
    )
    args = parser.parse_args()
    if args.hosts < 1 or args.serial < 1 or args.rounds < 1 or args.reps < 1:
        parser.error("--hosts, --serial, --rounds and --reps must be at least 1")
    if os.geteuid() != 0:
        print("bench_fleet: error: needs root (network namespaces, sshd)", file=sys.stderr)
        return 2

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    SCRATCH_PARENT.mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir=SCRATCH_PARENT))
    (scratch / "tmp").mkdir()
    os.environ["TMPDIR"] = str(scratch / "tmp")  # ours, orch's and Ansible's temporary files
    tempfile.tempdir = None
    try:
        doc = bench(args, scratch, say)
    except Exception as exc:  # BenchError, FleetError, a missing tool: said, exit 1
        print(f"bench_fleet: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "text"}, indent=2))
    else:
        print(doc["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
