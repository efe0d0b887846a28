"""A rank's helper processes (data-loader workers, checkpoint savers, multiprocessing's resource
tracker, grain's workers) ignore the stop signals: Slurm, systemd and torchrun signal every
process of a job or a process group at once, and a helper that died of it would take its
rank's last step and checkpoint with it. The rank ends its helpers itself, and the reapers
(`primus.core.launch.reaper`) end them if the rank dies.

`shield()` covers helpers forked from Python (`os.fork`, multiprocessing's fork), including
PyTorch's data-loader workers, which install their own SIGTERM handler after the fork, and
helpers multiprocessing starts as new interpreters (spawn, forkserver, the resource tracker),
whose command line ignores them before anything else runs. Plain `subprocess` children keep their
signals.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from primus.core.reliability.preemption import SIGNALS

# PyTorch's data-loader workers call this first thing, to install their C signal handlers
# (SIGTERM among them, which kills a worker that its parent did not signal)
_TORCH_WORKER_SIGNALS = ("torch.utils.data._utils.signal_handling", "_set_worker_signal_handlers")

_shielded = False


def _ignore_stop_signals() -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _after_fork_in_child() -> None:
    """In a forked child of a rank: ignore the stop signals, also after PyTorch's data-loader
    worker set-up (the module is imported in the rank already when it forks its workers)."""
    if not _shielded:
        return
    _ignore_stop_signals()
    module = sys.modules.get(_TORCH_WORKER_SIGNALS[0])
    if module is not None:
        setup = getattr(module, _TORCH_WORKER_SIGNALS[1])
        setattr(module, _TORCH_WORKER_SIGNALS[1], _then_ignore(setup))


def _then_ignore(setup: Callable[[], None]) -> Callable[[], None]:
    @functools.wraps(setup)
    def set_up_then_ignore() -> None:
        setup()
        _ignore_stop_signals()

    return set_up_then_ignore


def _ignoring_stop_signals(args: Sequence[str]) -> list[str]:
    """multiprocessing's command line for a new interpreter (`python ... -c PROGRAM ...`) with
    the stop signals ignored before PROGRAM runs, then unblocked (`_spawn_shielded` starts it
    with them blocked: one sent while the interpreter starts is dropped, not fatal)."""
    args = list(args)
    if "-c" in args[:-1]:
        at = args.index("-c") + 1
        numbers = ", ".join(str(int(sig)) for sig in SIGNALS)
        args[at] = (
            f"import signal\nfor s in ({numbers}): signal.signal(s, signal.SIG_IGN)\n"
            f"signal.pthread_sigmask(signal.SIG_UNBLOCK, ({numbers},))\n{args[at]}"
        )
    return args


def _spawn_shielded(spawn: Callable[..., int]) -> Callable[..., int]:
    """`spawn` (fork and exec) with the stop signals blocked around it: the new interpreter
    inherits the mask, so a signal to the whole job while it starts waits until it ignores them;
    this process gets its own once the spawn returns."""

    @functools.wraps(spawn)
    def spawn_ignoring_stop_signals(path: str, args: Sequence[str], *rest: Any) -> int:
        shielded = _ignoring_stop_signals(args)
        if shielded == list(args):  # no program to put the unblocking in front of
            return spawn(path, shielded, *rest)
        before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            return spawn(path, shielded, *rest)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    return spawn_ignoring_stop_signals


def shielded() -> bool:
    """Whether `shield()` ran in this process (it cannot be undone)."""
    return _shielded


def shield() -> None:
    """From now on, the helper processes this process starts ignore the stop signals.
    Call in the main thread of a rank (or a single-process run), once its own handlers are set."""
    global _shielded
    if _shielded or not sys.platform.startswith("linux"):
        return
    import multiprocessing.popen_fork
    import multiprocessing.util

    _shielded = True
    os.register_at_fork(after_in_child=_after_fork_in_child)
    multiprocessing.util.spawnv_passfds = _spawn_shielded(multiprocessing.util.spawnv_passfds)
    # Its helpers ignore SIGTERM, so the process's own `terminate()` of one (multiprocessing's
    # exit joins its daemonic children after it; a data loader ends a stuck worker so) kills it.
    popen = multiprocessing.popen_fork.Popen  # spawn's and forkserver's derive from it
    popen.terminate = popen.kill  # type: ignore[method-assign]
    atexit.register(_helper_deaths_unwatched)  # runs before multiprocessing's own exit handler


def _helper_deaths_unwatched() -> None:
    """At exit, before multiprocessing kills the helpers still running: PyTorch's SIGCHLD
    handler would take a data-loader worker killed so for a failure and raise it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
