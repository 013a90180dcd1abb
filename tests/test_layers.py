"""The engine's subpackages import one way only, and no module imports itself round a circle;
the task library's packages too (tasks/__init__.py draws their order).

Every import counts: module level, inside functions (the lazy ones that keep `orch status`
fast) and under TYPE_CHECKING, since a circle hidden in a function is a circle all the same.
The order is the one docs/design.md draws; a subpackage may import its own modules and those
of the layers below it, never above.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "orchestrator"

# Lowest first. Top-level modules (api, cli, __init__, __main__) are the front: they may import
# anything; nothing below may import them.
LAYERS = ["core", "proc", "store", "kinds", "plan", "run", "views", "api", "agent", "fleet", "cli"]
FRONT = {"__init__": "cli", "__main__": "cli", "api": "api", "cli": "cli", "shortcut": "cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "cli"  # the package itself: its lazy exports
    head = parts[1]
    return FRONT.get(head, head)


def imports_of(path: Path, module: str, root: str = "orchestrator") -> set[str]:
    """The modules of package `root` that `path` imports, wherever in the file."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from orchestrator.run import loop`: the module loop
                known = f"{base}.{alias.name}" in MODULES or f"{base}.{alias.name}" in TASKS
                found.add(f"{base}.{alias.name}" if known else base)
    return {m for m in found if m == root or m.startswith(f"{root}.")}


MODULES = {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}
TASK_LIBRARY = ENGINE.parent / "tasks"
TASKS = {module_name(p): p for p in sorted(TASK_LIBRARY.rglob("*.py"))}
GRAPH = {m: imports_of(p, m) - {m} for m, p in MODULES.items()}
# The task library's packages, lowest first: a package imports its own modules and those of the
# packages before it. The result schema (analysis) sits below the benchmark that writes it.
TASK_LAYERS = ["host", "serving", "analysis", "benchmark"]
MAX_TASK_MODULE_LINES = 650  # ~600: one concern a module
TASK_GRAPH = {m: imports_of(p, m, "tasks") - {m} for m, p in TASKS.items()}


def test_every_engine_module_is_in_a_known_layer() -> None:
    assert {layer_of(m) for m in MODULES} <= set(LAYERS)


def test_no_import_goes_up_a_layer() -> None:
    wrong = [
        f"{m} ({layer_of(m)}) imports {dep} ({layer_of(dep)})"
        for m, deps in GRAPH.items()
        for dep in sorted(deps)
        if dep != "orchestrator" and LAYERS.index(layer_of(dep)) > LAYERS.index(layer_of(m))
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle() -> None:
    # A package imports its own __init__ implicitly: only the modules' explicit imports count.
    graph = {m: {d for d in deps if d != "orchestrator"} for m, deps in GRAPH.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())  # a generator: run it
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_the_checks_see_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The two checks above bite: a store module importing the run loop is both."""
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["orchestrator.store.db"].add("orchestrator.run.loop")
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(graph).static_order())
    assert LAYERS.index(layer_of("orchestrator.run.loop")) > LAYERS.index(
        layer_of("orchestrator.store.db")
    )


def test_each_subpackage_says_what_it_is_and_what_it_may_import() -> None:
    for layer in LAYERS:
        init = ENGINE / layer / "__init__.py"
        if not init.exists():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"{init}: say what it may import"
        below = LAYERS[: LAYERS.index(layer)]
        named = {w.strip(".,:;()`") for w in doc.split("May import", 1)[1].split()}
        assert named & set(below) == set(below) or layer == "core", (init, below)


# --- the task library ---------------------------------------------------------------------------


def task_layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tasks"  # the package itself: imports nothing


def test_every_task_module_is_in_a_package_of_its_concern() -> None:
    loose = [m for m in TASKS if m != "tasks" and task_layer_of(m) not in TASK_LAYERS]
    assert not loose, f"modules outside tasks' packages ({TASK_LAYERS}): {loose}"


def test_no_task_import_goes_up_a_package_or_round_a_circle() -> None:
    wrong = [
        f"{m} ({task_layer_of(m)}) imports {dep} ({task_layer_of(dep)})"
        for m, deps in TASK_GRAPH.items()
        for dep in sorted(deps)
        if dep != "tasks"
        and TASK_LAYERS.index(task_layer_of(dep)) > TASK_LAYERS.index(task_layer_of(m))
    ]
    assert not wrong, "\n".join(wrong)
    graph = {m: {d for d in deps if d != "tasks"} for m, deps in TASK_GRAPH.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())  # a generator: run it
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_the_engine_never_imports_the_task_library() -> None:
    reaching = {m for m, p in MODULES.items() if imports_of(p, m, "tasks")}
    assert not reaching, f"the engine imports tasks/: {sorted(reaching)}"


def test_each_task_package_says_what_it_holds_and_no_module_is_too_long() -> None:
    for package in TASK_LAYERS:
        doc = ast.get_docstring(ast.parse((TASK_LIBRARY / package / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"tasks/{package}/__init__.py: say what it holds"
    long = {
        str(p.relative_to(TASK_LIBRARY)): n
        for p in TASKS.values()
        if (n := len(p.read_text().splitlines())) > MAX_TASK_MODULE_LINES
    }
    assert not long, f"split these by concern (at most {MAX_TASK_MODULE_LINES} lines): {long}"
