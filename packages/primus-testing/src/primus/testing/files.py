"""Helpers for the files promise (docs/reliability.md, "Files: only the run directory"): what a
run wrote, by snapshotting folders before and after it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Python's bytecode cache (moved with PYTHONPYCACHEPREFIX, off with PYTHONDONTWRITEBYTECODE):
# a declared cache, written next to the modules imported, wherever they are installed.
DECLARED_CACHE_PARTS = frozenset({"__pycache__"})


def snapshot(*roots: Path) -> dict[Path, tuple[int, int]]:
    """Every file under `roots`: path -> (mtime_ns, size)."""
    files = {}
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                try:
                    st = path.lstat()
                except FileNotFoundError:  # removed while walking
                    continue
                files[path] = (st.st_mtime_ns, st.st_size)
    return files


def written(before: dict[Path, tuple[int, int]], after: dict[Path, tuple[int, int]]) -> list[Path]:
    """Files new or changed (mtime or size) between two snapshots."""
    return sorted(p for p, stat in after.items() if before.get(p) != stat)


def written_outside(paths: list[Path], run_dir: Path, caches: tuple[Path, ...] = ()) -> list[Path]:
    """Those of `paths` neither in `run_dir`, nor in one of `caches`, nor in a declared cache
    folder (DECLARED_CACHE_PARTS)."""
    allowed = (run_dir, *caches)
    return [
        p
        for p in paths
        if not any(p.is_relative_to(a) for a in allowed)
        and not DECLARED_CACHE_PARTS.intersection(p.parts)
    ]


def run_writes(
    config: Path, tmp_path: Path, repo: Path, *overrides: str, **env: str
) -> tuple[Path, list[Path]]:
    """`primus train pretrain --config config OVERRIDES` (exp_name=... among them) with HOME
    and TMPDIR pointed at fresh folders, so that the snapshot is exact and other processes'
    /tmp noise stays out of it: HOME under `tmp_path`, TMPDIR directly under /tmp (short, as
    multiprocessing's sockets need; folders.temp_dir_too_long); the workspace is `tmp_path`/ws.
    Asserts it succeeded; returns its run directory and every file it wrote in HOME, TMPDIR,
    `tmp_path` and `repo` (the environment under it included)."""
    from primus.testing.runs import primus

    home, workspace = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    tmp = Path(tempfile.mkdtemp(prefix="primus-t-", dir="/tmp"))
    try:
        before = snapshot(tmp_path, tmp, repo)
        result = primus(
            "train", "pretrain", "--config", str(config), *overrides, cwd=tmp_path,
            PRIMUS_WORKSPACE=str(workspace), HOME=str(home), TMPDIR=str(tmp), **env,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        name = next(o.split("=", 1)[1] for o in overrides if o.startswith("exp_name="))
        return next(workspace.rglob(name)), written(before, snapshot(tmp_path, tmp, repo))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
