"""The engine's subpackages import one way only, and no module imports itself round a circle.

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


def imports_of(path: Path, module: str) -> set[str]:
    """The orchestrator modules `path` imports, wherever in the file."""
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
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m == "orchestrator" or m.startswith("orchestrator.")}


MODULES = {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}
GRAPH = {m: imports_of(p, m) - {m} for m, p in MODULES.items()}


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
        graphlib.TopologicalSorter(graph).static_order()
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
