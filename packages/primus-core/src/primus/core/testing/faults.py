"""Fault injection for the reliability tests: a real `primus train` subprocess, and a real signal
to its launcher or to one of its workers once the run has reached a given step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from primus.core.preemption import EXIT_PREEMPTED, marked


def parent_pids() -> dict[int, int]:
    """Pid -> parent pid of every process, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError):
                continue
    return parents


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in (parents or parent_pids()).items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def worker_rank(pid: int) -> int | None:
    """The RANK of a Primus worker process (`python -m primus.cli` with RANK set), else None."""
    try:
        if b"primus.cli" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v[5:]) for v in env if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def workers(launcher: int) -> dict[int, int]:
    """Rank -> pid of the Primus workers below `launcher`. A worker's reaper is its child with
    the same RANK; it is told apart by its parent, not by a later pid (pids wrap around)."""
    parents = parent_pids()
    ranks = {pid: worker_rank(pid) for pid in descendants(launcher, parents)}
    return {
        rank: pid
        for pid, rank in ranks.items()
        if rank is not None and ranks.get(parents.get(pid, 0)) != rank
    }


def steps_logged(run_dir: Path) -> int:
    """The last step in the run's metrics.jsonl (0 before the first)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


@dataclass
class Interrupted:
    """What a signalled run left: its exit code, output, the marker of `stop()`, and when
    (time.time()) the signal was sent and the run ended."""

    returncode: int
    stdout: str
    stderr: str
    marker: dict | None
    signalled_at: float
    ended_at: float

    @property
    def preempted(self) -> bool:
        return self.returncode == EXIT_PREEMPTED and self.marker is not None


def interrupt(
    command: list[str],
    run_dir: Path,
    sig: signal.Signals,
    *,
    at_step: int,
    to_rank: int | None = None,
    ready: Callable[[Path], int] = steps_logged,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> Interrupted:
    """Run `python -m primus.cli COMMAND...`; once `ready(run_dir)` (the last logged step)
    reaches `at_step`, send `sig` to the launcher (`to_rank` None) or to the worker of that rank;
    wait for the run to end. `command` must keep the run going well past `at_step`."""
    environment = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"} | (env or {})
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "primus.cli", *command], env=environment, stdout=out, stderr=err
        )
        try:
            deadline = time.monotonic() + timeout_s
            while ready(run_dir) < at_step and proc.poll() is None:
                assert time.monotonic() < deadline, f"step {at_step} not reached in {timeout_s} s"
                time.sleep(0.05)
            signalled_at = time.time()
            if proc.poll() is None:
                os.kill(proc.pid if to_rank is None else workers(proc.pid)[to_rank], sig)
            proc.wait(timeout=timeout_s)
            ended_at = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert ready(run_dir) >= at_step, f"the run ended before step {at_step}:\n{stderr[-4000:]}"
    return Interrupted(proc.returncode, stdout, stderr, marked(run_dir), signalled_at, ended_at)
