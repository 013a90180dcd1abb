"""Plan files: the models, and loading that reports every problem at once with its line.

Nothing here touches the host: a plan is validated completely before anything runs.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import graphlib
import hashlib
import heapq
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from orchestrator.core.errors import PlanError, PlanIssue, Suggester, TemplateError, did_you_mean
from orchestrator.core.guards import GuardRole
from orchestrator.core.guards import does as guard_does
from orchestrator.core.redact import MASK, masking
from orchestrator.kinds import registry
from orchestrator.kinds.task import Duration, as_list
from orchestrator.plan.templating import (
    Ref,
    compile_when,
    iter_refs,
    resolve,
    splices,
)
from orchestrator.plan.trust import choosing_code
from orchestrator.plan.yamlsource import (
    SYNTAX_ERROR,
    YAML_ERROR,
    Located,
    Path_,
    load_yaml,
    parse_yaml,
)
from orchestrator.proc.stalls import Action as StallAction

ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]*$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a plan's name: it names the store's file
# What a value that misses one of these patterns is told, in words (got ... follows).
_PATTERN_WORDS = {
    ID_PATTERN: "letters, digits, `_` and `-`, not starting with `-`",
    NAME_PATTERN: "letters, digits, `_`, `-` and `.`, starting with a letter or digit",
}
# Tighter than yamlsource's per-value limit: ids and names become file names, log names and
# board columns. `when` is evaluated recursively at run time, so its depth is bounded here.
MAX_ID_CHARS = 128
MAX_TITLE_CHARS = 256
MAX_WHEN_CHARS = 1000
MAX_WHEN_DEPTH = 32


def _as_retries(value: object) -> object:
    return {"attempts": value} if isinstance(value, int) and not isinstance(value, bool) else value


def _as_task_list(value: object) -> object:
    """`on_failure:` one task (a mapping) or a list of them."""
    return [value] if isinstance(value, dict) else value


def _stall_after(seconds: float) -> float:
    from orchestrator.proc.stalls import MIN_STALL_AFTER

    if seconds < MIN_STALL_AFTER:
        raise ValueError(
            f"{seconds:g}s is too short: at least {MIN_STALL_AFTER:g}s (progress is sampled "
            "every 0.2s at best)"
        )
    return seconds


# How long a task's processes may make no progress before it is reported stalled (stalls.py).
StallAfter = Annotated[Duration, AfterValidator(_stall_after)]


def _timeout(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(
            "0s would end every attempt as it starts: give a positive duration (e.g. 30s), "
            "or leave it out for no limit"
        )
    return seconds


def _poll_every(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("polling every 0s would run the check back to back: e.g. `every: 2s`")
    return seconds


# Durations that must be positive. The others may be 0: `retries.delay: 0` retries at once,
# `wait: 0` checks once (as no `wait` does); `stall_after` has its own floor (StallAfter).
# A task's time limit: 0 would fail every attempt as it starts ("timed out after 0s").
Timeout = Annotated[Duration, AfterValidator(_timeout)]
# A precondition's poll interval while it waits: 0 would re-run the check in a busy loop.
PollEvery = Annotated[Duration, AfterValidator(_poll_every)]


class Retries(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    attempts: int = Field(1, ge=1, le=100, description="tries in all, the first included")
    delay: Duration = Field(0.0, description="wait between tries (0: at once)")


class TaskSpec(BaseModel):
    """One entry of `tasks:`. The names are the plan's words."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str = Field(pattern=ID_PATTERN, max_length=MAX_ID_CHARS)
    title: str | None = Field(None, max_length=MAX_TITLE_CHARS)
    priority: Literal["high", "medium", "low"] = "medium"
    kind: str
    # Factories, not `= {}`: pydantic deep-copies a mutable default at every validation.
    params: dict[str, Any] = Field(default_factory=dict)
    needs: Annotated[list[str], BeforeValidator(as_list)] = Field(default_factory=list)
    preconditions: list[dict[str, Any]] = Field(default_factory=list)
    when: bool | str | None = None
    timeout: Timeout | None = None
    retries: Annotated[Retries, BeforeValidator(_as_retries)] = Field(
        default_factory=lambda: Retries()
    )
    # Stall watch of its processes; not in the spec hash (like timeout): a run-time policy.
    stall_after: StallAfter | None = None
    on_stall: StallAction | None = None
    # What it holds while it runs, of the plan's `resources` (name -> units): with --jobs, a
    # task starts only when its units are free. Scheduling only: not in the spec hash.
    # Or of a pool the host has by id (`gpus: 2`, `gpus: [0, 1]`: registry.POOL_GROUP).
    resources: dict[
        Annotated[str, Field(pattern=ID_PATTERN)],
        Annotated[int, Field(ge=1)] | Annotated[list[int | str], Field(min_length=1)],
    ] = Field(default_factory=dict)
    # What undoes it if the plan fails after it completed (armed in the store with its
    # completion, so a crash cannot lose it): task mappings, each run like a task of its own.
    on_failure: Annotated[list[dict[str, Any]], BeforeValidator(_as_task_list)] = Field(
        default_factory=list
    )


class CheckSpec(BaseModel):
    """The engine's part of a precondition entry; every other key is the kind's param."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    kind: str
    wait: Duration | None = Field(None, description="poll until it holds, up to this long")
    every: PollEvery = Field(2.0, description="seconds between polls while waiting")


def _within_folder(pattern: str) -> str:
    """A `files:` entry: a path or glob under the plan's folder, never out of it."""
    parts = pattern.split("/")
    if not pattern or pattern.startswith("/") or ".." in parts or "\0" in pattern:
        raise ValueError("a path under the plan's folder, such as scripts/check.sh or data/*")
    if parts[0] == ".orch":
        raise ValueError("the plan's .orch folder is its host's own, not sent")
    return pattern


class PlanHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_ID_CHARS)
    description: str = ""
    vars: dict[str, Any] = {}
    jobs: int = Field(1, ge=1, le=64, description="tasks run at once (--jobs overrides)")
    # Named resources and their units (`disk-heavy: 1`, `port: 4`): tasks hold some of them.
    resources: dict[Annotated[str, Field(pattern=ID_PATTERN)], Annotated[int, Field(ge=1)]] = {}
    stall_after: StallAfter | None = None  # every task's, unless it says otherwise
    on_stall: StallAction | None = None
    tasks: list[Any] = Field(min_length=1)
    # Tasks run at the end of every run that did work, whatever its outcome (or first thing in
    # the next run, if this one was killed).
    finally_: list[Any] = Field([], alias="finally")
    # What travels with the plan to a fleet's hosts besides it and the *.py beside it
    # (fleet/folder.py); absent: the whole folder but .orch.
    files: list[Annotated[str, AfterValidator(_within_folder)]] | None = None


@dataclass
class PlannedCheck:
    kind: str
    cls: type[Any]
    params: dict[str, Any]  # with ${...} unresolved
    wait: float | None
    every: float
    line: int | None


@dataclass
class PlannedTask:
    spec: TaskSpec
    cls: type[Any]
    checks: list[PlannedCheck]
    spec_hash: str
    fingerprint: dict[str, Any]  # what the hash covers, kept to say what changed
    spec_json: str  # the fingerprint as stored
    line: int | None
    position: int = 0
    role: GuardRole | None = None  # a compensation or a `finally` task; None: the flow
    protects: str | None = None  # the task a compensation undoes

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def title(self) -> str:
        return self.spec.title or self.spec.id


@dataclass(frozen=True)
class AddedTask:
    """A task its store holds that no plan file declares (an agent's, `orch todo add`'s):
    its mapping as a plan's `tasks:` entry would hold it, validated with the plan's."""

    definition: dict[str, Any]
    origin: str  # agent | person


@dataclass
class Plan:
    name: str
    description: str
    file: Path
    vars: dict[str, Any]
    tasks: list[PlannedTask]  # in dependency order; ties keep the file's order
    secrets: frozenset[str] = frozenset()  # vars whose values are masked as *** (redact.py)
    overrides: dict[str, Any] = field(default_factory=dict)  # the --var values it was loaded with
    jobs: int = 1  # tasks at once, unless --jobs says otherwise
    resources: dict[str, int] = field(default_factory=dict)  # name -> units
    added: dict[str, str] = field(default_factory=dict)  # added task id -> origin
    # Compensations and `finally` tasks: outside the flow, run by the engine when due.
    guards: list[PlannedTask] = field(default_factory=list)
    files: tuple[str, ...] | None = None  # the plan's `files:` (None: not given)
    by_id: dict[str, PlannedTask] = field(default_factory=dict)
    dependents: dict[str, list[str]] = field(default_factory=dict)

    @property
    def secret_values(self) -> list[Any]:
        """The values to mask as *** wherever orch writes (redact.register)."""
        return [self.vars[name] for name in self.secrets]

    def __post_init__(self) -> None:
        self.by_id = {t.id: t for t in [*self.tasks, *self.guards]}
        # task id -> its compensations; None -> the `finally` tasks
        self.guarded: dict[str | None, list[str]] = {}
        for g in self.guards:
            self.guarded.setdefault(g.protects, []).append(g.id)
        self.dependents = {t.id: [] for t in self.tasks}
        for t in self.tasks:
            for need in t.spec.needs:
                self.dependents[need].append(t.id)

    def undo_order(self, armed: Iterable[str]) -> list[PlannedTask]:
        """These armed guards in the order the engine runs them: compensations first, in the
        order given (the store's: the latest armed first, so the last step done is the first
        undone), then `finally` tasks in the plan's order. Ids the plan no longer has are left
        out."""
        found = [self.by_id[i] for i in armed if i in self.by_id]
        return [g for g in found if g.role == GuardRole.ON_FAILURE] + sorted(
            (g for g in found if g.role == GuardRole.FINALLY), key=lambda g: g.position
        )

    def upstream(self, task_id: str) -> list[str]:
        """Every task `task_id` needs, directly or not, sorted (KeyError: no such task)."""
        found = self._needs.of(self.by_id[task_id].id)
        assert found is not None  # a loaded plan has no cycle and no unknown need
        return sorted(found)

    @functools.cached_property
    def _needs(self) -> Upstream:
        """The tasks' needs as Upstream walks them (guards need nothing), made on first use."""
        return Upstream({t.id: list(t.spec.needs) for t in self.by_id.values()}, set())

    def downstream(self, task_id: str) -> list[str]:
        """`task_id` and every task that depends on it, directly or not, in plan order."""
        seen = {task_id}
        stack = [task_id]
        while stack:
            for dep in self.dependents[stack.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        return [t.id for t in self.tasks if t.id in seen]


def load_plan(
    path: Path,
    var_overrides: dict[str, Any] | None = None,
    added: Sequence[AddedTask] = (),
    text: str | None = None,
) -> Plan:
    """Load and validate a plan (the file, or `text` as if it were that file) with the tasks
    `added` to its store after the declared ones; PlanError lists every problem found. A
    `module:Class` kind is imported from the plan's folder first."""
    with registry.search(path.absolute().parent):
        return _load_plan(path, var_overrides, added, text)


def with_added(plan: Plan, added: Sequence[AddedTask]) -> Plan:
    """The plan with the tasks added to its store: reloaded, so they are validated exactly
    as declared ones are (kinds, params, needs, refs); the same plan when there are none."""
    return load_plan(plan.file, plan.overrides, added) if added else plan


class _WithAdded(Located):
    """The plan's source, where the `tasks:` entries past the file's own are added tasks:
    their problems name the task and who added it, not a line of the file."""

    def __init__(self, src: Located, declared: int, added: Sequence[AddedTask]) -> None:
        super().__init__(src.data, src.file, src.lines)
        self.declared, self.added_tasks = declared, added

    def _added_at(self, path: Path_) -> AddedTask | None:
        at = path[1] if len(path) > 1 and path[0] == "tasks" else None
        if isinstance(at, int) and at >= self.declared:
            return self.added_tasks[at - self.declared]
        return None

    def line(self, path: Path_) -> int | None:
        return None if self._added_at(path) else super().line(path)

    def issue(self, path: Path_, message: str) -> PlanIssue:
        task = self._added_at(path)
        if task is None:
            return super().issue(path, message)
        return PlanIssue(f"added by {task.origin}", None, message)  # the message names it


def _load_plan(
    path: Path,
    var_overrides: dict[str, Any] | None,
    added: Sequence[AddedTask] = (),
    text: str | None = None,
) -> Plan:
    src = load_yaml(path) if text is None else parse_yaml(text, str(path))
    issues: list[PlanIssue] = []
    suggest = Suggester()  # one budget for the whole plan: did-you-mean stays linear
    if not isinstance(src.data, dict):
        raise PlanError([src.issue((), "a plan is a mapping with `name` and `tasks`")])
    try:
        header = PlanHeader.model_validate({**src.data, "tasks": src.data.get("tasks") or []})
    except ValidationError as exc:
        issues += [src.issue(tuple(e["loc"]), _sentence(e, PlanHeader)) for e in exc.errors()]
        header = None
    # A bad name or description must not hide the tasks' problems; bad vars or tasks would
    # only bury the real error under follow-on ones, so stop there.
    raw_vars = header.vars if header else src.data.get("vars", {})
    raw_tasks = header.tasks if header else src.data.get("tasks")
    if not isinstance(raw_vars, dict) or not isinstance(raw_tasks, list) or not raw_tasks:
        raise PlanError(issues)
    if added:
        src = _WithAdded(src, len(raw_tasks), added)
        raw_tasks = [*raw_tasks, *(a.definition for a in added)]
    variables, secrets = _declared_vars(src, raw_vars, issues)
    for key, value in (var_overrides or {}).items():
        if key not in variables:
            issues.append(
                src.issue(
                    ("vars",), f"--var {key}: the plan has no var {key!r}{suggest(key, variables)}"
                )
            )
        elif (problem := _override_problem(variables[key], value)) is not None:
            given, plan_value = (
                (MASK, MASK) if key in secrets else (_shown(value), _shown(variables[key]))
            )
            issues.append(
                src.issue(
                    ("vars", key),
                    f"--var {key}={given}: {problem} (the plan's value is {plan_value})",
                )
            )
        elif isinstance(variables[key], str) and isinstance(value, int | float):
            variables[key] = _shown(value)  # `--var tag=123`: read as YAML, meant as text
        else:
            variables[key] = value

    specs: list[tuple[int, TaskSpec]] = []
    raw_ids: dict[str, int] = {}
    for i, raw in enumerate(raw_tasks):
        where: Path_ = ("tasks", i)
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        if isinstance(raw_id, str):
            if raw_id in raw_ids:
                issues.append(
                    src.issue(
                        (*where, "id"),
                        f"duplicate task id {raw_id!r} "
                        f"(first at line {src.line(('tasks', raw_ids[raw_id]))})",
                    )
                )
            else:
                raw_ids[raw_id] = i
        raw = _resources_from_vars(raw, variables)
        try:
            specs.append((i, TaskSpec.model_validate(raw)))
        except ValidationError as exc:
            label = f"task {raw_id!r}: " if isinstance(raw_id, str) else ""
            issues += [
                src.issue((*where, *e["loc"]), label + _sentence(e, TaskSpec)) for e in exc.errors()
            ]
            if (salvaged := _salvage(raw, exc)) is not None:
                specs.append((i, salvaged))
            else:  # no id or bad needs: its vars are still checked (the rest needs a task)
                issues += [
                    src.issue(where, label + problem)
                    for ref in _var_refs(raw)
                    if (problem := _var_problem(ref, variables, suggest))
                ]

    for i, spec in specs:
        for name, units in spec.resources.items():
            have = header.resources.get(name) if header else None
            where_r: Path_ = ("tasks", i, "resources", name)
            if have is None and _is_pool(name):
                continue
            if have is not None and not isinstance(units, int):
                issues.append(
                    src.issue(where_r, f"task {spec.id!r}: {name!r} is held by units (a number)")
                )
            elif have is None:
                known = header.resources if header else {}
                issues.append(
                    src.issue(
                        where_r,
                        f"task {spec.id!r} holds unknown resource {name!r}"
                        f"{suggest(name, [*known, *registry.known_kinds(registry.POOL_GROUP)])}"
                        ": declare it under `resources:`",
                    )
                )
            elif isinstance(units, int) and units > have:
                issues.append(
                    src.issue(
                        where_r,
                        f"task {spec.id!r} holds {units} of {name!r}, which has {have}: "
                        "it could never start",
                    )
                )
    specs = _stall_defaults(src, specs, header, issues)
    upstream, order = _check_graph(src, specs, raw_ids, issues, suggest)
    planned: dict[str, PlannedTask] = {}
    ids = set(raw_ids)
    # What the kinds' param validators are told: a plan is being checked (builtins' `python`
    # then looks for its module), and a memo of theirs for this load (modules found).
    context: dict[str, Any] = {"plan_file": Path(src.file).name, "memo": {}}
    for i, spec in specs:
        task = _plan_task(
            src, ("tasks", i), spec, variables, ids, upstream, issues, suggest, context, secrets
        )
        if task is not None:
            planned.setdefault(spec.id, task)
    guards = []
    for where, guard in _guard_specs(src, specs, header, raw_ids, issues):
        # Its ${tasks...} may name what it protects and that task's upstream; a `finally`
        # task, any task (one that did not run leaves no finding: the guard then fails).
        upstream.graph[guard.spec.id] = [guard.protects] if guard.protects else list(ids)
        task = _plan_task(
            src, where, guard.spec, variables, ids, upstream, issues, suggest, context, secrets
        )
        if task is not None:
            task.role, task.protects = guard.role, guard.protects
            guards.append(task)
    if issues or header is None:
        # One cause can surface on two paths; a secret's value is never shown (`sk BAD-5555x`
        # refused as a shell word is named, not printed).
        hide = masking(variables[name] for name in secrets if name in variables)
        raise PlanError([i._replace(message=hide(i.message)) for i in dict.fromkeys(issues)])

    ordered = [planned[task_id] for task_id in order]  # no issues: every task is in both
    for position, t in enumerate([*ordered, *guards]):  # guards listed after the flow
        t.position = position
    return Plan(
        header.name,
        header.description,
        path,
        variables,
        ordered,
        secrets,
        overrides=dict(var_overrides or {}),
        added={str(a.definition["id"]): a.origin for a in added},
        jobs=header.jobs,
        resources=dict(header.resources),
        guards=guards,
        files=None if header.files is None else tuple(header.files),
    )


@dataclass
class _Guard:
    spec: TaskSpec
    role: GuardRole
    protects: str | None


# A guard runs alone, when the engine says: it has no place in the flow to need or hold.
_NOT_IN_GUARDS = ("needs", "on_failure", "resources")


def _guard_specs(
    src: Located,
    specs: list[tuple[int, TaskSpec]],
    header: PlanHeader | None,
    raw_ids: dict[str, int],
    issues: list[PlanIssue],
) -> list[tuple[Path_, _Guard]]:
    """The compensations (`on_failure` of each task) and the plan's `finally` tasks,
    validated like tasks; their ids share the plan's name space."""
    found: list[tuple[Path_, Any, GuardRole, str | None]] = []
    for i, spec in specs:
        raw = src.data["tasks"][i] if i < len(src.data.get("tasks") or []) else None
        single = isinstance(raw, dict) and isinstance(raw.get("on_failure"), dict)
        for j, g in enumerate(spec.on_failure):
            at: Path_ = ("tasks", i, "on_failure") if single else ("tasks", i, "on_failure", j)
            found.append((at, g, GuardRole.ON_FAILURE, spec.id))
    for j, g in enumerate(header.finally_ if header else []):
        found.append((("finally", j), g, GuardRole.FINALLY, None))
    out: list[tuple[Path_, _Guard]] = []
    seen = dict(raw_ids)
    for at, raw, role, protects in found:
        if not isinstance(raw, dict):
            issues.append(src.issue(at, f"{role}: each entry is a task (a mapping with an id)"))
            continue
        label = f"task {raw.get('id')!r}: " if isinstance(raw.get("id"), str) else ""
        try:
            spec = TaskSpec.model_validate(raw)
        except ValidationError as exc:
            issues += [
                src.issue((*at, *e["loc"]), label + _sentence(e, TaskSpec)) for e in exc.errors()
            ]
            continue
        if spec.id in seen:
            issues.append(src.issue((*at, "id"), f"duplicate task id {spec.id!r}"))
            continue
        seen[spec.id] = -1
        bad = [k for k in _NOT_IN_GUARDS if k in raw]
        for k in bad:
            issues.append(
                src.issue(
                    (*at, k),
                    f"{label}`{k}` has no meaning in {role}: it runs on its own "
                    f"(it {guard_does(role, protects)})",
                )
            )
        if not bad:
            out.append((at, _Guard(spec, role, protects)))
    return out


_DECLARATION = {"env", "default", "secret"}


def _declared_vars(
    src: Located, raw: dict[str, Any], issues: list[PlanIssue]
) -> tuple[dict[str, Any], frozenset[str]]:
    """Vars' values, and which are secret.

    A var is a plain value, or a declaration: a mapping of only `env` (take the value from
    this environment variable: secret unless `secret: false`), `default` (when the environment
    lacks it) and `secret` (mask the value as *** everywhere orch writes it).
    """
    values: dict[str, Any] = {}
    secrets: set[str] = set()
    for name, value in raw.items():
        if not (
            isinstance(value, dict)
            and value
            and set(value) <= _DECLARATION
            and ("env" in value or "secret" in value)
        ):
            values[name] = value
            continue
        where = ("vars", name)
        secret, env = value.get("secret", "env" in value), value.get("env")
        if not isinstance(secret, bool):
            issues.append(src.issue((*where, "secret"), f"var {name}: `secret` is true or false"))
        if env is not None and not (isinstance(env, str) and env):
            issues.append(
                src.issue((*where, "env"), f"var {name}: `env` names an environment variable")
            )
            env = None
        if env is not None and env in os.environ:
            values[name] = os.environ[env]
        elif "default" in value:
            values[name] = value["default"]
        elif env is not None:
            issues.append(
                src.issue(
                    where,
                    f"var {name}: the environment variable {env} is not "
                    "set (export it, or give the var a `default`)",
                )
            )
        else:
            issues.append(
                src.issue(
                    where, f"var {name}: a secret var needs a `default` or an `env` to come from"
                )
            )
        if secret is True:
            secrets.add(name)
    return values, frozenset(secrets)


def _override_problem(declared: Any, value: Any) -> str | None:
    """Why `value` cannot override a var whose plan value is `declared`, or None. A var's type
    is its value's in the plan (or its declaration's default): a --var for a number, a boolean,
    a list or a mapping must be one too (`size_mb=abc` would reach `dd` as text and fail there,
    or worse, not fail). Text and null vars take any value."""
    kinds = (
        (bool, "true or false"),
        ((int, float), "a whole number" if isinstance(declared, int) else "a number"),
        (list, "a list"),
        (dict, "a mapping"),
    )
    for kind, words in kinds:
        if isinstance(declared, kind):
            fits = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if isinstance(declared, int) and isinstance(value, float):
                fits = False  # a count (8) is not given as 8.5
            return None if fits else f"this var is {words}"
    return None


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


_VAR_ONLY = re.compile(r"\$\{vars\.([A-Za-z_][A-Za-z0-9_]*)\}")


def _resources_from_vars(raw: Any, variables: dict[str, Any]) -> Any:
    """`resources: {gpus: "${vars.tp}"}`: a resource's units may be one var, known at load
    (a finding is not: what a task holds is decided before it starts)."""
    held = raw.get("resources") if isinstance(raw, dict) else None
    if not isinstance(held, dict):
        return raw
    out = {}
    for name, units in held.items():
        m = _VAR_ONLY.fullmatch(units) if isinstance(units, str) else None
        out[name] = variables[m.group(1)] if m and m.group(1) in variables else units
    return {**raw, "resources": out}


def _stall_defaults(
    src: Located,
    specs: list[tuple[int, TaskSpec]],
    header: PlanHeader | None,
    issues: list[PlanIssue],
) -> list[tuple[int, TaskSpec]]:
    """The plan's `stall_after`/`on_stall` filled in where a task has none; `on_stall` with no
    `stall_after` anywhere is refused (it would never fire)."""
    after = header.stall_after if header else None
    action = header.on_stall if header else None
    if action is not None and after is None and all(s.stall_after is None for _, s in specs):
        issues.append(
            src.issue(
                ("on_stall",), "on_stall needs stall_after: how long without progress is a stall"
            )
        )
    defaults = {k: v for k, v in (("stall_after", after), ("on_stall", action)) if v is not None}
    out = []
    for i, spec in specs:
        if spec.on_stall is not None and spec.stall_after is None and after is None:
            issues.append(
                src.issue(
                    ("tasks", i, "on_stall"),
                    f"task {spec.id!r}: on_stall needs stall_after (on the task or the plan)",
                )
            )
        fill = {k: v for k, v in defaults.items() if getattr(spec, k) is None}
        out.append((i, spec.model_copy(update=fill) if fill else spec))
    return out


def _is_pool(name: str) -> bool:
    try:
        registry.resolve(name, registry.POOL_GROUP)
    except registry.UnknownKind:
        return False
    return True


def _var_refs(value: Any) -> list[Ref]:
    """The `${vars.X}` references in a raw task, up to a malformed one (reported elsewhere)."""
    refs: list[Ref] = []
    with contextlib.suppress(ValueError):
        refs += (ref for ref in iter_refs(value) if ref.task is None)
    return refs


def _var_problem(ref: Ref, variables: dict[str, Any], suggest: Suggester) -> str:
    if ref.name in variables:
        return ""
    return f"${{{ref}}}: no var {ref.name!r}{suggest(ref.name, variables)}"


def _salvage(raw: Any, exc: ValidationError) -> TaskSpec | None:
    """The task without its bad fields, so its other fields are still checked; None if that
    cannot be done (no id or kind, or bad `needs`, whose absence would fake graph errors)."""
    if not isinstance(raw, dict) or any(not e["loc"] for e in exc.errors()):
        return None
    bad = {e["loc"][0] for e in exc.errors()}
    if "needs" in bad:
        return None
    try:
        return TaskSpec.model_validate({k: v for k, v in raw.items() if k not in bad})
    except ValidationError:
        return None


def _check_graph(
    src: Located,
    specs: list[tuple[int, TaskSpec]],
    raw_ids: dict[str, int],
    issues: list[PlanIssue],
    suggest: Suggester,
) -> tuple[Upstream, list[str]]:
    """Unknown needs and cycles; returns the tasks' transitive upstream, where all known, and
    their dependency order (empty if there is a cycle)."""
    graph: dict[str, list[str]] = {}
    for i, spec in specs:
        for j, need in enumerate(spec.needs):
            if need not in raw_ids:
                message = f"task {spec.id!r} needs unknown task {need!r}{suggest(need, raw_ids)}"
                issues.append(src.issue(("tasks", i, "needs", j), message))
        graph[spec.id] = [n for n in spec.needs if n in raw_ids]
    order = _dependency_order(graph, raw_ids)  # None: there is a cycle
    # graphlib names one cycle at a time: take its tasks out and look again, to name them all.
    cyclic: set[str] = set()
    acyclic = graph
    while order is None:
        try:
            graphlib.TopologicalSorter(acyclic).prepare()
            break
        except graphlib.CycleError as exc:
            cycle: list[str] = exc.args[1][::-1]  # graphlib lists it against the arrows
            issues.append(
                src.issue(
                    ("tasks", raw_ids[cycle[0]], "needs"), f"dependency cycle: {' -> '.join(cycle)}"
                )
            )
            cyclic |= set(cycle)
            acyclic = {
                t: [n for n in needs if n not in cyclic]
                for t, needs in acyclic.items()
                if t not in cyclic
            }
    return Upstream(graph, cyclic | (set(raw_ids) - set(graph))), order or []


class Upstream:
    """Each task's transitive needs, computed only for the tasks that ask (those with finding
    references): all of them at once would cost O(n^2) on a long chain."""

    def __init__(self, graph: dict[str, list[str]], unknown: set[str]) -> None:
        self.graph, self.unknown = graph, unknown
        self._cache: dict[str, set[str] | None] = {}

    def of(self, task_id: str) -> set[str] | None:
        """None where the whole of it is not known: through a cycle, or a task whose needs
        could not be read. Iterative, so no recursion limit on long chains."""
        if task_id not in self._cache:
            seen: set[str] = set()
            stack = list(self.graph.get(task_id, []))
            known = task_id not in self.unknown
            while stack and known:
                need = stack.pop()
                if need in seen:
                    continue
                seen.add(need)
                known = need not in self.unknown
                stack.extend(self.graph.get(need, []))
            self._cache[task_id] = seen if known else None
        return self._cache[task_id]


def _plan_task(
    src: Located,
    where: Path_,
    spec: TaskSpec,
    variables: dict[str, Any],
    ids: set[str],
    upstream: Upstream,
    issues: list[PlanIssue],
    suggest: Suggester,
    context: dict[str, Any],
    secrets: frozenset[str] = frozenset(),
) -> PlannedTask | None:
    """`context`: what the kinds' param validators are told, one for the load (_load_plan)."""
    label = f"task {spec.id!r}"
    before = len(issues)

    used: set[str] = set()  # the vars it uses

    def check_refs(value: Any, at: Path_) -> list[Ref] | None:
        """The ${...} in `value`, their problems reported; None if one is malformed."""
        try:
            refs = list(iter_refs(value))
        except ValueError as exc:
            issues.append(src.issue(at, f"{label}: {exc}"))
            return None
        for ref in refs:
            issues.extend(
                src.issue(at, f"{label}: {p}")
                for p in _ref_problems(ref, spec.id, variables, ids, upstream, suggest)
            )
            if ref.task is None:
                used.add(ref.name)
        return refs

    try:
        cls = registry.resolve(spec.kind)
    except registry.UnknownKind as exc:
        issues.append(src.issue((*where, "kind"), f"{label}: {exc}"))
        cls = None
    # per param, so the error names its line
    refs = {key: check_refs(value, (*where, "params", key)) for key, value in spec.params.items()}
    if cls is not None:
        issues += [
            src.issue((*where, "params", key), f"{label}: param {key!r}: {why}")
            for key, why in choosing_code(cls, spec.params)
        ]
        _validate_params(
            src, (*where, "params"), label, cls, spec.params, refs, variables, issues, context
        )
    if isinstance(spec.when, str):
        if (problem := _when_problem(spec.when)) is not None:
            issues.append(src.issue((*where, "when"), f"{label}: {problem}"))
        check_refs(spec.when, (*where, "when"))

    checks: list[PlannedCheck] = []
    for j, raw in enumerate(spec.preconditions):
        at = (*where, "preconditions", j)
        try:
            check = CheckSpec.model_validate(raw)
        except ValidationError as exc:
            issues += [
                src.issue((*at, *e["loc"]), f"{label} precondition: {_sentence(e, CheckSpec)}")
                for e in exc.errors()
            ]
            continue
        params = dict(check.model_extra or {})
        param_refs = {key: check_refs(value, (*at, key)) for key, value in params.items()}
        try:
            check_cls = registry.resolve(check.kind, registry.PRECONDITION_GROUP)
        except registry.UnknownKind as exc:
            issues.append(src.issue((*at, "kind"), f"{label}: {exc}"))
            continue
        issues += [
            src.issue((*at, key), f"{label} precondition {check.kind!r}: param {key!r}: {why}")
            for key, why in choosing_code(check_cls, params)
        ]
        _validate_params(
            src,
            at,
            f"{label} precondition {check.kind!r}",
            check_cls,
            params,
            param_refs,
            variables,
            issues,
            context,
        )
        checks.append(
            PlannedCheck(check.kind, check_cls, params, check.wait, check.every, src.line(at))
        )
    if len(issues) > before or cls is None:
        return None
    # A secret is not part of a task's identity: a rotated token re-runs nothing (and is
    # never stored).
    fingerprint = {
        "kind": spec.kind,
        "params": spec.params,
        "when": spec.when,
        "preconditions": spec.preconditions,
        "vars": {k: MASK if k in secrets else variables[k] for k in sorted(used)},
    }
    spec_json = _FINGERPRINT_JSON.encode(fingerprint)
    digest = hashlib.sha256(spec_json.encode()).hexdigest()[:16]
    return PlannedTask(spec, cls, checks, digest, fingerprint, spec_json, src.line(where))


# json.dumps(fingerprint, sort_keys=True, default=str), its encoder made once
_FINGERPRINT_JSON = json.JSONEncoder(sort_keys=True, default=str)


def _when_problem(expr: str) -> str | None:
    """Why `when` cannot be used, or None. Length and depth are bounded now: evaluation
    recurses, and a 1,000-deep `not not ...` would crash the run that reaches it."""
    if len(expr) > MAX_WHEN_CHARS:
        return f"`when` is {len(expr):,} characters; the limit is {MAX_WHEN_CHARS:,}"
    try:
        tree, _ = compile_when(expr)
    except ValueError as exc:
        return str(exc)
    except (RecursionError, MemoryError):  # the parser's own limit on nesting
        return f"`when` is nested too deeply (more than {MAX_WHEN_DEPTH} levels)"
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]  # iterative: the tree may be deep
    while stack:
        node, depth = stack.pop()
        if depth > MAX_WHEN_DEPTH:
            return f"`when` is nested too deeply (more than {MAX_WHEN_DEPTH} levels)"
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return None


def _ref_problems(
    ref: Ref,
    task_id: str,
    variables: dict[str, Any],
    ids: set[str],
    upstream: Upstream,
    suggest: Suggester,
) -> list[str]:
    if ref.task is None:
        return [problem] if (problem := _var_problem(ref, variables, suggest)) else []
    if ref.task not in ids:
        return [f"${{{ref}}}: no task {ref.task!r}{suggest(ref.task, ids)}"]
    elif (above := upstream.of(task_id)) is not None and ref.task not in above:
        return [
            f"${{{ref}}}: {ref.task!r} is not among the needs of {task_id!r}; "
            "add it to `needs` so it runs first"
        ]
    return []


def _validate_params(
    src: Located,
    at: Path_,
    label: str,
    cls: type[Any],
    params: dict[str, Any],
    refs: dict[str, list[Ref] | None],
    variables: dict[str, Any],
    issues: list[PlanIssue],
    context: dict[str, Any],
) -> None:
    """Validate params against the kind's model now; fields that use findings wait for run time.

    Vars are known now, so they are substituted for this check (unquoted: it only checks types).
    `refs` holds each param's references (check_refs'), None where one is malformed: such a
    param is skipped too, check_refs has reported it already.
    """
    # A var spliced into shell text or an environment is known now: refuse it here, on its
    # line, not at run time.
    for name, splice in sorted(splices(cls, params).items()):
        if (found := refs[name]) is None:
            continue
        for ref in sorted({r for r in found if r.task is None and r.name in variables}, key=str):
            try:
                splice(ref, variables[ref.name])
            except TemplateError as exc:
                issues.append(src.issue((*at, name), f"{label}: param {name!r}: {exc}"))

    deferred = {
        k
        for k, found in refs.items()
        if found is None or any(r.task or r.name not in variables for r in found)
    }
    try:
        view = {
            k: resolve(v, lambda r: variables.get(r.name))
            for k, v in params.items()
            if k not in deferred
        }
        # A deferred param's name is still checked now: a typo must not wait for run time.
        view |= {k: None for k in deferred if k not in cls.Params.model_fields}
        # `plan_file` tells a kind's validators that a plan is being checked (builtins'
        # `python` then looks for its module).
        cls.Params.model_validate(view, context=context)
    except ValidationError as exc:
        fields = list(cls.Params.model_fields)
        for e in exc.errors():
            loc = e["loc"]
            if e["type"] == "missing" and loc and loc[0] in deferred:
                continue
            if not loc and deferred:  # a check across fields, some unknown until run time
                continue
            name = ".".join(str(p) for p in loc)
            if e["type"] == "extra_forbidden":
                msg = f"unknown param {name!r}{did_you_mean(str(loc[0]), fields)}"
                if fields:
                    msg += f"; {cls.__name__} takes: {', '.join(fields)}"
            elif e["type"] == "missing":
                msg = f"missing param {name!r}"
            else:
                msg = f"param {name!r}: {_message(e)}"
            issues.append(src.issue((*at, *loc), f"{label}: {msg}"))


def _dependency_order(graph: dict[str, list[str]], file_order: dict[str, int]) -> list[str] | None:
    """Task ids in topological order (`graph`: id -> its needs); among tasks ready together, the
    one written first goes first. None if there is a cycle (one graphlib pass does both)."""
    sorter = graphlib.TopologicalSorter(graph)
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return None
    ready = [(file_order[task_id], task_id) for task_id in sorter.get_ready()]
    heapq.heapify(ready)
    order = []
    while ready:
        _, task_id = heapq.heappop(ready)
        order.append(task_id)
        sorter.done(task_id)
        for ready_id in sorter.get_ready():
            heapq.heappush(ready, (file_order[ready_id], ready_id))
    return order


# What the whole of an entry is, when it is not a mapping (pydantic: "Input should be a valid
# dictionary or instance of TaskSpec").
_ENTRY = {
    "TaskSpec": "a task is a mapping with at least `id` and `kind`",
    "CheckSpec": "a precondition is a mapping with at least `kind`",
}
# Fields whose shape a newcomer gets wrong, in words (pydantic: "Input should be a valid list").
_SHAPE = {
    "tasks": "`tasks` is a list of tasks",
    "finally": "`finally` is a list of tasks",
    "vars": "`vars` is a mapping of names to values",
    "resources": "`resources` is a mapping of names to units",
    "needs": "`needs` is a task id or a list of them",
    "preconditions": "`preconditions` is a list of checks, each a mapping with a `kind`",
    "params": "`params` is a mapping of the kind's params",
    "retries": "`retries` is a number of tries, or a mapping with `attempts` and `delay`",
    "on_failure": "`on_failure` is a task (a mapping with `id` and `kind`) or a list of them",
}
# An entry of a list field, when it is not a mapping.
_LIST_ENTRY = {
    "preconditions": _ENTRY["CheckSpec"],
    "on_failure": "an `on_failure` entry is a task: a mapping with at least `id` and `kind`",
}
_SHAPE_ERRORS = {"dict_type", "list_type", "model_type", "model_attributes_type"}


def _sentence(error: Any, model: type[BaseModel] | None = None) -> str:
    loc = ".".join(str(p) for p in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _fields_at(model, error["loc"][:-1]) if model else []
        return f"unknown field {loc!r}{did_you_mean(str(error['loc'][-1]), known)}"
    if kind == "missing":
        return f"missing field {loc!r}"
    if kind == "too_short" and loc == "tasks":
        return "tasks: the list is empty; a plan needs at least one task"
    if kind in _SHAPE_ERRORS:
        if not loc and model is not None and model.__name__ in _ENTRY:
            return _ENTRY[model.__name__]
        if loc in _SHAPE:
            return _SHAPE[loc]
        if len(error["loc"]) == 2 and (entry := _LIST_ENTRY.get(str(error["loc"][0]))):
            return f"{loc}: {entry}"
    pattern = error.get("ctx", {}).get("pattern")
    if kind == "string_pattern_mismatch" and (words := _PATTERN_WORDS.get(pattern)):
        # A mapping's key (`resources: {"a b": 1}`) is named by its field, not by itself.
        field = str(error["loc"][0]) if error["loc"][-1:] == ("[key]",) else loc
        what = "an id" if loc == "id" else "a name"
        return f"{field}: {what} is {words} (got {error['input']!r})"
    if kind == "literal_error":
        expected = error["ctx"]["expected"]  # "'high', 'medium' or 'low'"
        said = error["input"]
        hint = did_you_mean(said, re.findall(r"'(.*?)'", expected)) if isinstance(said, str) else ""
        choices = expected.replace("'", "")
        return f"{loc}: {said!r} is not one of {choices}{hint}"
    return f"{loc}: {_message(error)}" if loc else _message(error)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at `loc` inside `model` (`retries` -> Retries)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        kinds = (field.annotation, *get_args(field.annotation)) if field else ()
        found = next((a for a in kinds if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if found is None:
            return []
        model = found
    return list(model.model_fields)


def _message(error: Any) -> str:
    return re.sub(r"^Value error, ", "", str(error["msg"]))


def parse_var(text: str) -> tuple[str, Any]:
    """`--var key=value`; the value is read as YAML by the plan's own reader (its limits, no
    duplicate keys), so `--var tp=8` is an int. Text that is not valid YAML is refused, not
    taken as a string: `--var 'x=[1,'` is a typo, not a name."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--var {text!r}: write KEY=VALUE")
    if not raw:
        return key, ""
    try:
        return key, parse_yaml(raw, f"--var {key}").data
    except PlanError as exc:
        problem = exc.issues[0].message
        if problem.startswith((SYNTAX_ERROR, YAML_ERROR)):  # text meant as text, most likely
            what = problem.removeprefix(SYNTAX_ERROR).removeprefix(YAML_ERROR)
            raise ValueError(
                f"--var {key}={raw!r} is not valid YAML ({what}):"
                f" for text, quote it: --var '{key}=\"...\"'"
            ) from None
        raise ValueError(f"--var {key}: {problem}") from None


def what_changed(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Plain lines naming what differs between two fingerprints: `params.command: 'a' -> 'b'`."""
    lines = []
    for key in sorted({*old, *new}):
        name = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            lines += what_changed(a, b, name + ".")
        elif isinstance(a, str) and isinstance(b, str):
            lines.append(f"{name}: {_differing(a, b)} -> {_differing(b, a)}")
        else:
            lines.append(f"{name}: {_short(a)} -> {_short(b)}")
    return lines


def _differing(text: str, other: str, context: int = 12) -> str:
    """`text` cut to where it differs from `other`, so a long command shows its change."""
    start = next(
        (i for i, (x, y) in enumerate(zip(text, other, strict=False)) if x != y),
        min(len(text), len(other)),
    )
    end = 0
    while end < min(len(text), len(other)) - start and text[-1 - end] == other[-1 - end]:
        end += 1
    lo, hi = max(start - context, 0), min(len(text) - end + context, len(text))
    return ("…" if lo else "") + repr(text[lo:hi]) + ("…" if hi < len(text) else "")


def _short(value: Any) -> str:
    text = "(none)" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
