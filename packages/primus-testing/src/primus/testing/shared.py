"""Runs made once per test session and read by every module that needs the same one, on any
pytest-xdist worker: the first to ask makes it, the others wait for it and read its folder.

Only for runs the tests read and never change (losses, logs, the resolved config); a test that
resumes, signals or edits a run makes its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from primus.testing.runs import train_run


def _session_folder(factory: pytest.TempPathFactory) -> Path:
    """A folder of this session that all its xdist workers share (each worker's basetemp is
    a subfolder of the session's)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(factory: pytest.TempPathFactory, key: str, make: Callable[[Path], Path]) -> Path:
    """What `make(folder)` returned for `key`, made once in this session (under a lock that the
    other workers wait on). A `make` that fails is tried again by the next to ask."""
    folder = _session_folder(factory) / "shared" / hashlib.sha256(key.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    made = folder / "made"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.is_file():
            made.write_text(str(make(folder / "work")))
        return Path(made.read_text())


def shared_train_run(
    factory: pytest.TempPathFactory, config: Path, *overrides: str, nproc: int = 1
) -> Path:
    """`train_run(config, ..., *overrides, nproc=nproc)` once per session for these settings
    (in any order), in a workspace of its own: its run directory."""
    settings = "\n".join([str(config.resolve()), *sorted(overrides), f"nproc={nproc}"])
    return shared(
        factory,
        settings,
        lambda folder: train_run(config, folder, *overrides, "exp_name=shared", nproc=nproc),
    )
