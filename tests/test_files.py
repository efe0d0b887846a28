"""The files promise, files: a workspace that cannot hold the run directory is one clear
error (exit 2, where it was set, a hint) before any work, and nothing is written outside the
run directory and the declared caches (docs/reliability.md, "Files: only the run directory")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from primus.testing.files import run_writes, snapshot, written_outside
from primus.testing.runs import primus

ROOT = Path(__file__).resolve().parents[1]
DUMMY_QUICKSTART = ROOT / "tests" / "fixtures" / "dummy-quickstart.yaml"


def error_and_hint(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The two stderr lines of a run that exited 2 with one error and its hint, no traceback."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, result.stderr  # the error and its hint
    return lines


# Tests run as root here, and root ignores chmod, so the unwritable workspaces are ones root
# cannot write either: a path under a regular file, and a path under /proc.
@pytest.mark.parametrize("kind", ["under-a-file", "under-proc"])
def test_an_unwritable_workspace_is_one_error_before_any_work(tmp_path, kind) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    workspace = blocker / "ws" if kind == "under-a-file" else Path("/proc/primus-ws")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = snapshot(tmp_path)
    result = primus(
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), cwd=cwd,
        PRIMUS_WORKSPACE=str(workspace),
    )  # fmt: skip
    lines = error_and_hint(result)
    assert f"workspace '{workspace}' cannot hold the run directory" in lines[0]
    assert "dummy-quickstart.yaml:7" in lines[0]  # where `workspace:` is set
    if kind == "under-a-file":
        assert lines[0].endswith(f"{blocker} is not a folder")
    assert lines[1].strip().startswith("hint: set workspace (or PRIMUS_WORKSPACE)")
    assert snapshot(tmp_path) == before  # nothing written


# Root ignores permissions through two capabilities; the run drops them (util-linux's setpriv)
# so that a folder without write permission stops it as it stops any other user.
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
     "--inh-caps=-dac_override,-dac_read_search", "--"]
    if os.geteuid() == 0 else []
)  # fmt: skip


def test_a_workspace_without_write_permission_is_one_error_before_any_work(tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    before = snapshot(tmp_path)
    result = subprocess.run(
        [*AS_A_USER, sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
         str(DUMMY_QUICKSTART)],
        env={k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
        | {"PRIMUS_WORKSPACE": str(locked / "ws"), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = error_and_hint(result)
    assert lines[0].endswith(f"Permission denied ({locked})")  # where ws/ would be made
    assert snapshot(tmp_path) == before


def test_a_missing_workspace_under_a_writable_folder_is_created(tmp_path) -> None:
    workspace = tmp_path / "new" / "ws"
    result = primus(
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), "train_iters=2",
        PRIMUS_WORKSPACE=str(workspace),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert (workspace / "local" / "local" / "quickstart" / "summary.json").is_file()


def test_a_dummy_run_writes_only_its_run_directory(tmp_path) -> None:
    """HOME and TMPDIR point at fresh folders (run_writes), the repository and its environment
    are snapshotted too; Python's __pycache__ folders are a declared cache."""
    run_dir, new = run_writes(DUMMY_QUICKSTART, tmp_path, ROOT, "exp_name=files", "train_iters=5")
    assert any(p.is_relative_to(run_dir) for p in new)
    assert written_outside(new, run_dir) == []


def _folder_of(length: int, parent: Path) -> Path:
    """A new folder whose absolute path is `length` bytes long."""
    pad = length - len(str(parent)) - 1
    assert pad > 0, parent
    folder = parent / ("t" * pad)
    folder.mkdir()
    return folder


def test_the_temp_dir_limit_is_where_multiprocessing_sockets_stop_binding() -> None:
    """SOCKET_PATH_MAX - SOCKET_SUFFIX is exactly the longest TMPDIR under which Python's
    multiprocessing can still bind its sockets; one byte more and binding fails."""
    import shutil
    import tempfile

    from primus.core.folders import SOCKET_PATH_MAX, SOCKET_SUFFIX

    room = SOCKET_PATH_MAX - SOCKET_SUFFIX
    parent = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        for length, fits in ((room, True), (room + 1, False)):
            folder = _folder_of(length, parent)
            bind = subprocess.run(
                [sys.executable, "-c",
                 "from multiprocessing.connection import Listener; Listener(family='AF_UNIX')"],
                env={**os.environ, "TMPDIR": str(folder)}, capture_output=True, text=True,
            )  # fmt: skip
            assert (bind.returncode == 0) == fits, (length, bind.stderr[-500:])
            if not fits:
                assert "AF_UNIX path too long" in bind.stderr
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(parent)


def test_a_temp_dir_too_long_for_sockets_is_one_error_before_any_work(tmp_path) -> None:
    """Without the check, a Megatron run's data-loader workers fail to bind a socket in a
    queue's feeder thread, and the run hangs before its first step."""
    temp = _folder_of(90, tmp_path)
    result = primus(
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), "train_iters=2",
        PRIMUS_WORKSPACE=str(tmp_path / "ws"), TMPDIR=str(temp),
    )  # fmt: skip
    lines = error_and_hint(result)
    assert lines[0].startswith(f"error: env TMPDIR: the temporary folder {temp} is 90 bytes")
    assert "the run would hang" in lines[0]
    assert lines[1].strip() == "hint: point TMPDIR at a shorter folder"
    assert not list((tmp_path / "ws").rglob("*.log"))  # no worker started
