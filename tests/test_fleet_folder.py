"""The plan's folder as it travels to a fleet's hosts (orchestrator/fleet/folder.py): what the
controller sends, and what a host does with a payload's files, hostile ones included. The
roll over real hosts that runs a script from its folder is in test_fleet.py."""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.errors import PlanError, UsageError
from orchestrator.fleet import folder
from orchestrator.fleet.folder import FileEntry, Shipped, checked_name, collect, entries, place
from orchestrator.plan.model import load_plan

PLAN = "name: p\n{files}tasks:\n  - {{id: a, kind: shell, params: {{command: 'true'}}}}\n"


def plan_in(tmp_path: Path, files: str = "") -> Path:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(files=files))
    return plan


def names(shipped: list[Shipped]) -> list[str]:
    return [f.name for f in shipped]


def sent(data: bytes, executable: bool = False) -> FileEntry:
    return FileEntry(
        sha256=hashlib.sha256(data).hexdigest(),
        executable=executable,
        data=base64.b64encode(data).decode(),
    )


def test_without_files_the_whole_folder_travels_but_orch_caches_and_hidden(tmp_path: Path) -> None:
    plan = plan_in(tmp_path)
    (tmp_path / "kinds.py").write_text("x = 1\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "check.sh").write_text("#!/bin/sh\necho ok\n")
    (tmp_path / "scripts" / "check.sh").chmod(0o755)
    for skipped in (".orch/p.db", "__pycache__/k.pyc", ".git/HEAD", ".env", "scripts/.swp"):
        (tmp_path / skipped).parent.mkdir(exist_ok=True)
        (tmp_path / skipped).write_text("no")
    shipped = collect(plan, load_plan(plan).files)
    assert names(shipped) == ["kinds.py", "p.yaml", "scripts/check.sh"]
    assert [f.executable for f in shipped] == [False, False, True]


def test_files_chooses_what_travels_beside_the_plan_and_its_modules(tmp_path: Path) -> None:
    plan = plan_in(tmp_path, "files: [scripts/*.sh, prompts.txt]\n")
    (tmp_path / "kinds.py").write_text("x = 1\n")
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/a.sh", "scripts/b.sh", "scripts/notes.md", "prompts.txt", "big.bin"):
        (tmp_path / name).write_text(name)
    assert names(collect(plan, load_plan(plan).files)) == [
        "kinds.py",
        "p.yaml",
        "prompts.txt",
        "scripts/a.sh",
        "scripts/b.sh",
    ]


def test_a_pattern_matching_nothing_is_said(tmp_path: Path) -> None:
    plan = plan_in(tmp_path, "files: [scripts/*.sh]\n")
    with pytest.raises(UsageError, match=r"files: 'scripts/\*.sh' matches no file under"):
        collect(plan, load_plan(plan).files)


def test_a_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("key")
    inside = tmp_path / "plan"
    inside.mkdir()
    plan = plan_in(inside)
    (inside / "creds").symlink_to(outside / "secret")
    with pytest.raises(UsageError, match="leads out of the plan's folder"):
        collect(plan, None)


def test_a_folder_over_the_bounds_is_refused_naming_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_in(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"\0" * 2048)
    monkeypatch.setattr(folder, "MAX_BYTES", 1024)
    with pytest.raises(UsageError, match=r"pass 0 MiB at model.bin: list what the hosts need"):
        collect(plan, None)
    monkeypatch.setattr(folder, "MAX_BYTES", 2**20)
    monkeypatch.setattr(folder, "MAX_FILES", 1)
    with pytest.raises(UsageError, match=r"2 files would travel with the plan \(at most 1\)"):
        collect(plan, None)


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("../x", "a path under the plan's folder"),
        ("/etc/passwd", "a path under the plan's folder"),
        ("a/../../x", "a path under the plan's folder"),
        (".orch/p.db", "the plan's .orch folder is its host's own"),
    ],
)
def test_a_files_entry_out_of_the_folder_is_a_plan_error_with_its_line(
    tmp_path: Path, entry: str, problem: str
) -> None:
    plan = plan_in(tmp_path, f"files:\n  - ok.txt\n  - {entry!r}\n")
    with pytest.raises(PlanError) as caught:
        load_plan(plan)
    (issue,) = caught.value.issues
    assert issue.line == 4 and problem in issue.message, issue


def test_a_file_the_host_holds_goes_by_digest_alone() -> None:
    shipped = [Shipped("a.sh", b"echo a", True), Shipped("b.txt", b"b", False)]
    held = {"a.sh": hashlib.sha256(b"echo a").hexdigest(), "b.txt": "0" * 64}
    out = entries(shipped, held)
    assert "data" not in out["a.sh"] and out["a.sh"]["executable"] is True
    assert base64.b64decode(out["b.txt"]["data"]) == b"b"  # held, but another version


def test_the_host_places_files_asks_for_what_it_lacks_and_keeps_the_unchanged(
    tmp_path: Path,
) -> None:
    script = b"#!/bin/sh\necho ok\n"
    files = {"p.yaml": sent(b"name: p"), "scripts/check.sh": sent(script, executable=True)}
    assert place(tmp_path, files) == []
    check = tmp_path / "scripts" / "check.sh"
    assert check.read_bytes() == script and os.access(check, os.X_OK)
    os.utime(check, (1, 1))
    by_digest = {n: e.model_copy(update={"data": None}) for n, e in files.items()}
    assert place(tmp_path, by_digest) == []
    assert check.stat().st_mtime == 1  # unchanged: not rewritten
    check.unlink()
    assert place(tmp_path, by_digest) == ["scripts/check.sh"]


def test_the_host_refuses_bytes_that_are_not_their_digest(tmp_path: Path) -> None:
    wrong = sent(b"one").model_copy(update={"data": base64.b64encode(b"two").decode()})
    with pytest.raises(ValueError, match="do not match their sha256"):
        place(tmp_path, {"x.sh": wrong})
    assert not (tmp_path / "x.sh").exists()


def test_the_host_never_writes_through_a_link_in_its_folder(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "scripts").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="is not a plain folder"):
        place(home, {"scripts/check.sh": sent(b"x")})
    (home / "run.sh").symlink_to(elsewhere / "run.sh")
    with pytest.raises(ValueError, match="is a link"):
        place(home, {"run.sh": sent(b"x")})
    assert list(elsewhere.iterdir()) == []


@given(st.text(max_size=30))
def test_a_name_the_host_accepts_stays_in_its_folder(name: str) -> None:
    """Whatever the payload names, a file is written under the plan's folder or not at all."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        top = Path(tmp) / "plan"
        top.mkdir()
        try:
            checked_name(name)
            place(top, {name: sent(b"x")})
        except (ValueError, OSError):
            assert list(top.rglob("*")) == [] or all(
                p.resolve().is_relative_to(top.resolve()) for p in top.rglob("*")
            )
            return
        written = [p for p in top.rglob("*") if p.is_file()]
        assert written and all(p.resolve().is_relative_to(top.resolve()) for p in written)
        assert not any(p.name == ".orch" for p in top.iterdir())
