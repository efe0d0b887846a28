"""Preemption: SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 (Slurm's warning before the kill) ends a run
at a step boundary with a checkpoint and exit code 75, "preempted, resumable"
(docs/reliability.md). A second SIGINT aborts at once (exit 130).

`primus train` calls `watch()` first thing, in the launcher and in every worker. After each
training step a backend asks `requested()` (and agrees across ranks: the signal may reach one rank
only), saves a checkpoint of that step, and calls `stop()`, which marks the run dir and raises
`Preempted`. Running the same command again resumes from that checkpoint. A signal before the
first step stops the run there, with nothing to save: the launcher does not start its workers,
and a worker started after it (the signal is in its environment, ENV) or given it during set-up
stops before training. A launcher starts its workers with the stop signals blocked (`held`), and
`watch()` unblocks them: one that comes while a worker's interpreter starts waits for its handler.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

from primus.core.errors import PrimusError
from primus.core.logging import get_logger
from primus.core.reliability.atomic import write_atomic

EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: a temporary failure, run the same command again
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
ABORT = signal.SIGINT  # received again after the first stop signal: abort, no checkpoint
SAME_DELIVERY_S = 0.5  # a SIGINT this soon after the first is the same one passed on twice
MARKER = "preempted.json"  # in the run dir: written by rank 0 once the checkpoint is complete
GRACE_S = 120  # how long a launcher waits for its workers to save before it kills them
ENV = "PRIMUS_PREEMPTED"  # the signal's name, for the processes started after it

_received: int | None = None
_received_at = 0.0
_watcher = 0  # the process that called `watch()`: those forked from it do not announce a signal
_exit_quiet = False  # `_quiet_at_exit` is registered
# from a worker's start (`watch(setting_up=True)`) or within `stopping_before_training`,
# until `training_starts`
_setting_up = False
_unsaved: str | None = None  # why a stop writes no checkpoint (`stops_unsaved`); None: it does


class SetUpInterrupted(Exception):
    """Long set-up work (a reference model's pass over the data) cut short once every rank
    agreed on a stop signal: within `stopping_before_training`, the run stops before its first
    step."""


class Preempted(PrimusError):
    """The run stopped on a preemption signal after writing a checkpoint (or before the first
    step). Exit code 75."""

    exit_code = EXIT_PREEMPTED
    label = "preempted"


def note(signum: int) -> bool:
    """Record a preemption signal: `requested()` and the processes started from now on see it.
    True where this call recorded it, False where one was recorded already."""
    global _received, _received_at
    if _received is not None:
        return False
    # set with no call in between: a signal whose handler runs inside this one (Python runs
    # handlers at calls) finds it recorded and says nothing
    _received = signum
    _received_at = time.monotonic()
    os.environ[ENV] = signal.Signals(signum).name
    return True


def is_abort(signum: int) -> bool:
    """True for a SIGINT after the first stop signal (Ctrl-C twice), except a SIGINT that
    follows a SIGINT within SAME_DELIVERY_S: uv and the launchers pass on the SIGINT that a
    whole process group got as well, and that copy is the same request."""
    if signum != ABORT or _received is None:
        return False
    return _received != ABORT or time.monotonic() - _received_at > SAME_DELIVERY_S


def abort() -> NoReturn:
    """End this process at once, as SIGINT's default action does (exit 130 to its parent)."""
    os.write(2, b"[primus] SIGINT again: aborting without a checkpoint\n")
    end_by(ABORT)


def end_by(sig: int) -> NoReturn:
    """End this process by `sig`'s default action, as its parent then sees it (killed by it)."""
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1)  # the signal arrives here; should it not, exit as it would
    os._exit(128 + sig)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if is_abort(signum):
        abort()
    if not note(signum) or os.getpid() != _watcher:  # noted before, or a forked process
        return
    again = " (Ctrl-C again to abort)" if signum == ABORT else ""
    saved = f", without a checkpoint ({_unsaved})" if _unsaved else " with a checkpoint"
    when = (
        " during set-up: stopping before the first step"
        if _setting_up
        else f": stopping after this step{saved}"
    )
    message = f"[primus] {signal.Signals(signum).name} received{when}{again}\n"
    os.write(2, message.encode())  # no logging lock inside a signal handler


def stops_unsaved(why: str) -> None:
    """A stop of this run writes no checkpoint (`why`: its backend's setting): a signal's
    announcement says so rather than promising one."""
    global _unsaved
    _unsaved = why


def watch(setting_up: bool = False) -> None:
    """From now on SIGTERM, SIGINT and SIGUSR1 only ask the run to stop at the next step
    boundary (a second SIGINT aborts); one that reached the process which started this one
    (ENV) counts as received, and one held for this process (`held`) arrives now. This process
    says so on stderr; those forked from it (which inherit the handler) only note it.
    `setting_up`: this process (a launcher, a worker) has not set up yet, so a signal stops it
    before its first step (and it says so).
    Call again where an upstream installs its own handlers (JAX's distributed runtime)."""
    global _watcher, _setting_up, _exit_quiet
    _watcher = os.getpid()
    _setting_up = _setting_up or setting_up
    if _received is None and (name := os.environ.get(ENV)) in {s.name for s in SIGNALS}:
        note(signal.Signals[name])
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    if not _exit_quiet:  # once, early: it runs after the exit handlers registered later
        atexit.register(_quiet_at_exit)
        _exit_quiet = True
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _quiet_at_exit() -> None:
    """A process that is ending on a stop signal ignores the copies still on their way (uv
    passes on what the process group got as well, 0.2 s later): Python gives the signals back
    their default action while it shuts down, and a copy would end the process by the signal,
    its exit code (75) lost."""
    if _received is not None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Within, the stop signals wait (blocked in this thread; this process gets its own at the
    end). A process started within inherits them blocked, so that one sent while it starts
    waits until `watch()` handles it: for a process that calls it, Primus's CLI (else a SIGINT
    there is a KeyboardInterrupt traceback, a SIGTERM a silent death)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def requested() -> str | None:
    """The name of the preemption signal this process received, or None."""
    return signal.Signals(_received).name if _received is not None else None


def requested_number() -> int:
    """The number of the preemption signal this process received (0: none): what ranks agree
    on, the largest, where set-up work checks for a stop (then `SetUpInterrupted`)."""
    return _received or 0


def agreed(largest: Callable[[int], float]) -> int:
    """The stop signal the ranks agree on, the largest any received (0: none): `largest` is the
    backend's collective that takes each rank's number and gives the largest (every rank must
    call). A process that got none itself names the agreed one as its own, silently: the marker
    and the messages say which signal stopped the run."""
    signum = int(largest(requested_number()))
    if signum and _received is None:
        note(signum)
    return signum


@contextlib.contextmanager
def stopping_before_training(run_dir: Path, rank: int) -> Iterator[None]:
    """Within: the run is setting up until `training_starts` (a signal then says the run stops
    before its first step), and a `SetUpInterrupted` stops it there (`stop`)."""
    global _setting_up
    _setting_up = True
    try:
        yield
    except SetUpInterrupted:
        stop(run_dir, None, None, rank)
    finally:
        _setting_up = False


def training_starts(run_dir: Path, rank: int) -> None:
    """Set-up is done: a signal received during it stops the run here, before its first step,
    with nothing to save; one received from now on, after the step it arrives in."""
    global _setting_up
    if requested():
        stop(run_dir, None, None, rank)
    _setting_up = False


def clear(run_dir: Path) -> None:
    """Remove an earlier run's marker: the run dir says "preempted" only for this run."""
    (run_dir / MARKER).unlink(missing_ok=True)


def marked(run_dir: Path) -> dict | None:
    """What `stop()` wrote in `run_dir`, or None when this run was not preempted."""
    try:
        return json.loads((run_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def wait_marked(run_dir: Path, seconds: float) -> dict | None:
    """`marked(run_dir)` once it is there, polling for up to `seconds`; None after."""
    deadline = time.monotonic() + seconds
    while (found := marked(run_dir)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def mark(run_dir: Path, step: int | None, checkpoint: Path | str | None) -> None:
    """Say in `run_dir` that this run was preempted at `step` with `checkpoint` (None, None:
    before the first step): what `marked` reads, and what a Slurm job requeues on."""
    record = {
        "step": step,
        "signal": requested() or "a preemption signal",
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "time": time.time(),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / MARKER, json.dumps(record) + "\n")


def stop(run_dir: Path, step: int | None, checkpoint: Path | str | None, rank: int) -> NoReturn:
    """After every rank has written the checkpoint of `step` (None, None: before the first step,
    with nothing to save): mark the run dir (rank 0) and raise `Preempted`, whose message says
    how to resume."""
    name = requested() or "a preemption signal"
    if rank == 0:
        mark(run_dir, step, checkpoint)
    if step is None:
        get_logger().info(f"preempted by {name} before the first step")
        raise Preempted(
            f"{name} before the first step: nothing new to save",
            hint="run the same command again to start (or resume) the run",
        )
    get_logger().info(f"preempted by {name} at step {step}; checkpoint {checkpoint}")
    raise Preempted(
        f"{name} at step {step}: checkpoint {checkpoint} written",
        hint=f"run the same command again to resume from step {step}",
    )
