"""Reapers: a small forked process that outlives a training process and ends what it started
once it dies, however it dies (SIGKILL included): data-loader workers, checkpoint savers,
multiprocessing's resource tracker and spawned children, which no death signal reaches.

- `start_group_reaper`, for a worker that leads its own process group (both Primus launchers
  start workers so): SIGKILL to the group.
- `start_descendant_reaper`, for a run that shares its process group with others (a single
  process under a shell, `uv run` or a job script): it notes the run's descendants every
  POLL_S, and once the run is gone ends them, with those orphaned since the last look (in the
  run's group, started after it, adopted where its children went). A child that moved to a
  session of its own and was started and orphaned between two looks escapes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1
REAP = signal.SIGRTMIN + 3  # the reaper's death signal: one nobody else sends
POLL_S = 0.25  # how often the descendant reaper looks at the run's descendants
GRACE_S = 1.0  # how long descendants get to end by themselves (the resource tracker cleans up)
_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def die_with_parent(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent exits (prctl PR_SET_PDEATHSIG).
    False where there is no prctl (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0)


def _fork_reaper(on_parent_death: Callable[[], None], wait: Callable[[], None]) -> None:
    """Fork a reaper that runs `on_parent_death` once this process dies, `wait` meanwhile.
    Returns in the parent only."""
    if os.fork() != 0:
        return
    try:  # the reaper: never returns into the parent's code
        parent = os.getppid()
        for sig in _IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(REAP, lambda *_: on_parent_death())
        die_with_parent(REAP)
        if os.getppid() != parent:
            on_parent_death()
        while True:
            wait()
    finally:
        os._exit(0)


def start_group_reaper() -> None:
    """For a process that leads its process group: SIGKILL the group once this process dies."""
    _fork_reaper(lambda: os.killpg(os.getpgrp(), signal.SIGKILL), signal.pause)


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, names one process across pid reuse
    ended: bool = False  # a zombie: ended, not yet reaped by its parent


def processes() -> dict[int, Process]:
    """Every process on this machine, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(entry.name)
        table[pid] = Process(
            pid, int(fields[1]), int(fields[2]), int(fields[19]), fields[0] == b"Z"
        )
    return table


def descendants(table: dict[int, Process], roots: set[int]) -> set[int]:
    """The pids below `roots` in `table` (not the roots)."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in roots:
                found.add(child)
                todo.append(child)
    return found


class _Descendants:
    """What the descendant reaper knows of the run: its descendants as last seen."""

    def __init__(self, run: Process) -> None:
        self.run = run
        self.seen: dict[int, Process] = {}

    def look(self) -> None:
        table = processes()
        if self.run.pid in table:
            self.seen = {p: table[p] for p in descendants(table, {self.run.pid})}

    def left(self) -> set[int]:
        """The run's descendants still alive: those seen, those below them, and the orphans
        adopted where the run's children went (in its group, started after it)."""
        table = processes()
        alive = {p for p, proc in self.seen.items() if table.get(p) == proc}
        adopters = {1} | {table[p].ppid for p in alive if self.seen[p].ppid == self.run.pid}
        orphans = {
            proc.pid
            for proc in table.values()
            if proc.ppid in adopters
            and proc.pgid == self.run.pgid
            and proc.start >= self.run.start
            and proc.pid != os.getpid()
        }
        return (alive | orphans | descendants(table, alive | orphans)) - {os.getpid()}

    def end(self) -> None:
        deadline = time.monotonic() + GRACE_S
        while (left := self.left()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(3):  # what the killed leave behind is adopted in turn
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not (left := self.left()):
                break
            time.sleep(0.05)
        os._exit(0)


def start_descendant_reaper() -> None:
    """For a run that shares its process group: end its descendants once it is gone (module
    docstring). Nothing where /proc is missing."""
    if not os.path.isdir("/proc/self"):
        return
    me = processes()[os.getpid()]
    run = _Descendants(me)

    def wait() -> None:
        run.look()
        time.sleep(POLL_S)

    _fork_reaper(run.end, wait)
