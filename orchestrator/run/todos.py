"""A plan an agent can extend: tasks added at run time, kept in the store beside the plan's.

The plan file stays the source of the declared tasks. An added task is a row of the store with
its origin (`agent`: the MCP server; `person`: `orch todo add`) and its mapping as a plan entry:

- with a kind, it is validated and run exactly like a declared task (the plan is reloaded with
  it: `plan.with_added`), survives re-runs and plan edits, and is removed only by `remove`;
- without one, it is a plain todo (an investigation, a question) that nothing runs: whoever
  keeps it sets its status.

`todowrite` takes an agent's own list (the schema of the field reports: content, status,
priority) and lays it on the board: items that name board tasks are compared with them, new
items become plain todos. There is never a second list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.errors import UsageError
from orchestrator.core.findings import Finding, FindingValue
from orchestrator.core.status import TODOWRITE, Status
from orchestrator.plan.model import (
    ID_PATTERN,
    MAX_ID_CHARS,
    MAX_TITLE_CHARS,
    AddedTask,
    Plan,
    load_plan,
    with_added,
)
from orchestrator.store.db import PLAN_ORIGIN, Store, TodoSpec

ORIGINS = ("agent", "person")
PRIORITIES = ("high", "medium", "low")
# The words a status is set with: the board's own, and the todowrite schema's `cancelled`.
STATUS_WORDS: dict[str, Status] = {**{str(s): s for s in Status}, "cancelled": Status.SKIPPED}
_TODO_KEYS = {"id", "title", "priority"}


def added_tasks(store: Store) -> list[AddedTask]:
    """The added tasks that run (they have a kind), as the plan's loader takes them."""
    return [
        AddedTask(json.loads(r["definition"]), r["origin"])
        for r in store.added()
        if r["kind"] is not None and r["definition"]
    ]


def plan_as_run(plan: Plan, store: Store | None) -> Plan:
    """The plan a run on `store` runs: the file's tasks and those added to the store (by
    `orch todo add` or an agent), validated as one plan. The one place it is built."""
    return with_added(plan, added_tasks(store)) if store is not None else plan


def todo_specs(plan: Plan) -> list[TodoSpec]:
    """The plan's tasks as the store keeps them (the added ones with their origin)."""
    return [
        TodoSpec(
            t.id,
            t.position,
            t.title,
            t.spec.priority,
            t.spec.kind,
            t.spec.needs,
            t.spec_hash,
            t.spec_json,
            plan.added.get(t.id, PLAN_ORIGIN),
            t.role,
            t.protects,
        )  # fmt: skip
        for t in [*plan.tasks, *plan.guards]
    ]


def ensure_plan(plan: Plan, store: Store) -> None:
    """Put the plan's declared tasks on the board of a store no run has synced yet, so that a
    list handed over before the first run meets them; writes nothing once they are there.
    Left to the run while one holds the store (it synced the plan it loaded)."""
    from orchestrator.store.lock import RunLock

    if RunLock(store.path).try_probe():
        store.bind_plan(plan.name)
        store.sync_plan(todo_specs(plan_as_run(plan, store)), None)


def add(plan: Plan, store: Store, definition: Mapping[str, Any], origin: str) -> str:
    """Put a task on the board; returns its id. With a `kind`, it is validated as part of the
    plan (PlanError lists the problems); without one it is a todo: `id`, `title`, `priority`."""
    if origin not in ORIGINS:
        raise UsageError(f"origin is one of {', '.join(ORIGINS)}")
    definition = dict(definition)
    task_id = definition.get("id")
    if not isinstance(task_id, str) or not re.fullmatch(ID_PATTERN, task_id):
        raise UsageError(
            f"a task's id is letters, digits, _ and - (not starting with -): {task_id!r}"
        )
    if len(task_id) > MAX_ID_CHARS:
        raise UsageError(f"a task's id is at most {MAX_ID_CHARS} characters")
    ensure_plan(plan, store)
    if task_id in plan.by_id:  # declared, perhaps not run yet (the store checks the rest)
        raise UsageError(f"task {task_id!r} is already on the board (the plan file declares it)")
    if definition.get("kind") is None:
        definition.pop("kind", None)
        store.add_todo(_todo_spec(definition), origin, None)
        return task_id
    extended = load_plan(
        plan.file, plan.overrides, [*added_tasks(store), AddedTask(definition, origin)]
    )
    spec = next(s for s in todo_specs(extended) if s.id == task_id)
    store.add_todo(spec, origin, json.dumps(definition))
    return task_id


def _todo_spec(definition: Mapping[str, Any]) -> TodoSpec:
    extra = set(definition) - _TODO_KEYS
    if extra:
        raise UsageError(
            f"a todo with no kind has only {', '.join(sorted(_TODO_KEYS))} "
            f"(not {', '.join(sorted(extra))}): give it a kind to run it"
        )
    title = definition.get("title") or definition["id"]
    priority = definition.get("priority", "medium")
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise UsageError(f"a title is text of at most {MAX_TITLE_CHARS} characters")
    if priority not in PRIORITIES:
        raise UsageError(f"priority is one of {', '.join(PRIORITIES)}, not {priority!r}")
    return TodoSpec(definition["id"], 0, title, priority, "", (), "", "{}")


def remove(store: Store, task_id: str, by: str) -> None:
    """Take an added task off the board. One that runs is refused while a run holds the
    store: that run has it in its plan."""
    from orchestrator.store.lock import RunLock

    row = store.todo(task_id)
    if row is not None and row["kind"] is not None and not RunLock(store.path).try_probe():
        raise UsageError(f"a run is going on this store: remove {task_id!r} after it ends")
    store.remove_todo(task_id, by)


def status_of(word: str) -> Status:
    try:
        return STATUS_WORDS[word]
    except KeyError:
        raise UsageError(f"unknown status {word!r}: one of {', '.join(STATUS_WORDS)}") from None


def note(
    store: Store,
    task_id: str,
    author: str,
    text: str | None = None,
    key: str | None = None,
    value: FindingValue | None = None,
    unit: str | None = None,
) -> Finding:
    """Record a finding (`key`, `value`, `unit`, `text` as its note) or a note alone."""
    from orchestrator.core.findings import checked

    if key is None:
        if value is not None or unit is not None:
            raise UsageError("a finding's value and unit need its key")
        if not text:
            raise UsageError("give a note's text, or a finding's key and value")
        finding = Finding("note", text, None, None, author)
    else:
        if value is None:
            raise UsageError(f"finding {key!r}: give its value")
        if not re.fullmatch(r"[^\s=]{1,128}", key):
            raise UsageError(f"finding key {key!r}: 1 to 128 characters, no spaces or =")
        finding = checked(Finding(key, value, unit, text, author))
    store.note(task_id, finding, author)
    return finding


# --- todowrite -------------------------------------------------------------------------------


@dataclass
class Merge:
    """What a todowrite list did to the board."""

    matched: list[dict[str, Any]] = field(default_factory=list)  # items naming board tasks
    added: list[str] = field(default_factory=list)  # new todos, by id
    updated: list[str] = field(default_factory=list)  # todos whose status the list set
    differs: list[dict[str, Any]] = field(default_factory=list)  # the list vs the store

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def todowrite(store: Store, items: Sequence[Mapping[str, Any]], origin: str) -> Merge:
    """Lay an agent's todo list on the board.

    An item names a board task by its `id`, by its title, or by what `--format todowrite`
    writes for it (the title, then findings in brackets). For a task that runs, the store is
    the truth: a status that differs is reported, not applied (run the task instead). A todo
    takes the item's status and priority. Any other item becomes a todo of `origin`.
    """
    merge = Merge()
    rows = {r["id"]: r for r in store.todos()}
    by_title = {_norm(r["title"]): r["id"] for r in rows.values()}
    checked = [_checked_item(item) for item in items]  # all or nothing: refuse before writing
    for item, (content, word, status, priority) in zip(items, checked, strict=True):
        task_id = _match(item, content, rows, by_title)
        if task_id is None:
            task_id = _new_id(content, rows)
            store.add_todo(
                _todo_spec(
                    {"id": task_id, "title": content[:MAX_TITLE_CHARS], "priority": priority}
                ),
                origin,
                None,
            )
            if status is not Status.PENDING:
                store.set_todo(task_id, status, None, origin)
            merge.added.append(task_id)
            rows[task_id] = store.todo(task_id)  # type: ignore[assignment]
            by_title[_norm(content)] = task_id
            continue
        row = rows[task_id]
        board = TODOWRITE[Status(row["status"])]
        merge.matched.append({"content": content, "id": task_id, "status": board})
        if row["kind"] is None:
            if Status(row["status"]) is not status:
                store.set_todo(task_id, status, None, origin)
                merge.updated.append(task_id)
        elif board != TODOWRITE.get(status, word):
            merge.differs.append(
                {
                    "id": task_id,
                    "yours": word,
                    "board": board,
                    "why": "a task that runs has the status its runs give it: "
                    + ("run it" if board == "pending" else "the store records what happened"),
                }
            )
    return merge


def _checked_item(item: Mapping[str, Any]) -> tuple[str, str, Status, str]:
    """An item's content, status word, status and priority; UsageError if one is wrong."""
    content = str(item.get("content") or "").strip()
    if not content and not isinstance(item.get("id"), str):
        raise UsageError("every item needs its content")
    word = str(item.get("status") or "pending")
    priority = item.get("priority") or "medium"
    if priority not in PRIORITIES:
        raise UsageError(f"{content!r}: priority is one of {', '.join(PRIORITIES)}")
    return content, word, status_of(word), priority


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _match(
    item: Mapping[str, Any],
    content: str,
    rows: Mapping[str, Any],
    by_title: Mapping[str, str],
) -> str | None:
    if isinstance(item.get("id"), str) and item["id"] in rows:
        return str(item["id"])
    text = _norm(content)
    if text in by_title:
        return by_title[text]
    if (kept := _norm(content[:MAX_TITLE_CHARS])) in by_title:  # a long one, kept cut
        return by_title[kept]
    # `--format todowrite` writes "<title> (<findings or why>)": the agent hands it back.
    head = text.rsplit(" (", 1)[0] if text.endswith(")") else None
    while head:
        if head in by_title:
            return by_title[head]
        head = head.rsplit(" (", 1)[0] if " (" in head else None
    return None


def _new_id(content: str, rows: Mapping[str, Any]) -> str:
    """A readable id from the item's text: "Diagnose SGLang hang" -> diagnose_sglang_hang."""
    base = re.sub(r"[^a-z0-9]+", "_", content.lower()).strip("_")[:48].rstrip("_") or "todo"
    task_id, n = base, 2
    while task_id in rows:
        task_id, n = f"{base}_{n}", n + 1
    return task_id
