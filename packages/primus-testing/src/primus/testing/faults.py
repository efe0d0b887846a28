"""Fault injection for the reliability tests: a real `primus train` subprocess, and a real signal
to its launcher or to one of its workers once the run has reached a given step."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from primus.core.launch.reaper import Process, processes
from primus.core.launch.reaper import descendants as below
from primus.core.metrics import read_metrics
from primus.core.reliability.preemption import EXIT_PREEMPTED, marked
from primus.testing.processes import left_alive


def parent_pids() -> dict[int, int]:
    """Pid -> parent pid of every process, from /proc."""
    return {pid: proc.ppid for pid, proc in processes().items()}


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...)."""
    table = {
        child: Process(child, parent, 0, 0) for child, parent in (parents or parent_pids()).items()
    }
    return sorted(below(table, {pid}))


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
    """The last step in the run's metrics.jsonl (0 before the first; a torn last line, a
    record being written, left out)."""
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
        return records[-1]["step"] if records else 0
    except (OSError, ValueError, KeyError):
        return 0


def _send(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a helper that ended meanwhile
            os.kill(pid, sig)


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
    left: list[int]  # of the processes the run had started at the signal, those alive 5 s on

    @property
    def preempted(self) -> bool:
        return self.returncode == EXIT_PREEMPTED and self.marker is not None


PYTHON = [sys.executable, "-m", "primus.cli"]  # how `interrupt` starts primus by default
UV = shutil.which("uv")
UV_RUN = [str(UV), "run", "--no-sync", "primus"]  # as users start it; needs uv (UV)


def signal_targets(top: int, to: int | str | None) -> list[int]:
    """Who gets the signal: the process started (`to` None), the worker of rank `to`, or, for
    `to="everyone"`, every process of the run at once, as Slurm and systemd signal a job: the
    process started, launcher, workers, their data loaders, savers and reapers."""
    if to == "everyone":
        return [top, *descendants(top)]
    return [top if to is None else workers(top)[int(to)]]


def interrupt(
    command: list[str],
    run_dir: Path,
    sig: signal.Signals,
    *,
    at_step: int,
    to_rank: int | str | None = None,
    again_after_s: float | None = None,
    prefix: list[str] = PYTHON,
    ready: Callable[[Path], int] = steps_logged,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> Interrupted:
    """Run `primus COMMAND...` (through `prefix`: python -m, or UV_RUN); once `ready(run_dir)`
    (the last logged step) reaches `at_step`, send `sig` to `signal_targets(to_rank)`, and the
    same again `again_after_s` later (Ctrl-C twice) if given; wait for the run to end.
    `command` must keep the run going well past `at_step`."""
    environment = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"} | (env or {})
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*prefix, *command], env=environment, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + timeout_s
            while ready(run_dir) < at_step and proc.poll() is None:
                assert time.monotonic() < deadline, f"step {at_step} not reached in {timeout_s} s"
                time.sleep(0.05)
            signalled_at = time.time()
            started = descendants(proc.pid)
            if proc.poll() is None:
                targets = signal_targets(proc.pid, to_rank)
                _send(targets, sig)
                if again_after_s is not None:
                    time.sleep(again_after_s)
                    _send(targets[:1], sig)
            proc.wait(timeout=timeout_s)
            ended_at = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert ready(run_dir) >= at_step, f"the run ended before step {at_step}:\n{stderr[-4000:]}"
    left = left_alive(started, timeout_s=5)
    return Interrupted(
        proc.returncode, stdout, stderr, marked(run_dir), signalled_at, ended_at, left
    )
