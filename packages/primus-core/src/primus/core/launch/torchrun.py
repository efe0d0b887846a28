"""Starting workers through torchrun (torch.distributed.run, imported only here): its
arguments, the first stop signal passed on (a second one aborts), and its failures as one exit
code."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from types import FrameType
from typing import Any

from primus.core.errors import PrimusError
from primus.core.launch.launcher import (
    LAUNCHER_PID,
    Launch,
    failure_code,
    forget_reports,
    how_it_ended,
)
from primus.core.reliability import preemption
from primus.core.reliability.preemption import EXIT_PREEMPTED, GRACE_S


@functools.cache
def torchrun_options() -> frozenset[str]:
    """The options the installed torchrun takes (`--shutdown-timeout`, the workers' grace
    after a signal, is not in older torch releases, whose torchrun allows a fixed 30 s)."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError:  # no torch: run_torchrun says how to get it
        return frozenset()
    return frozenset(o for action in get_args_parser()._actions for o in action.option_strings)


def torchrun_args(worker_argv: list[str], launch: Launch) -> list[str]:
    """torchrun's arguments to run `python -m primus.cli <worker_argv>` in every worker."""
    addr, port = launch.rendezvous()
    return [
        f"--nproc-per-node={launch.nproc_per_node}",
        f"--nnodes={launch.nnodes}",
        f"--node-rank={launch.node_rank}",
        f"--master-addr={addr}",
        f"--master-port={port}",
        # SIGUSR1 too (Slurm's warning): passed on to the workers, which save and exit 75
        "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        *([f"--shutdown-timeout={GRACE_S}"] if "--shutdown-timeout" in torchrun_options() else []),
        "-m",
        "primus.cli",
        *worker_argv,
    ]


# How a worker that did not fail ends: it saved its step, or torchrun stopped it with SIGTERM
# when another rank ended.
STOPPED = (EXIT_PREEMPTED, -signal.SIGTERM)


def failed_launch_code(failures: list[Any]) -> int:
    """The launcher's exit code for torchrun's failed workers (its `ProcessFailure`s): the
    `failure_code` of the first that failed; 75 when none failed and one saved its step. A
    worker that exited 75, or died of the SIGTERM torchrun sends the others once one has ended,
    did not fail. torchrun may record, in one pass, the worker it stopped beside, or before,
    the one that failed or was preempted."""
    failures = sorted(failures, key=lambda failure: failure.timestamp)
    errors = [f for f in failures if f.exitcode not in STOPPED]
    if errors or all(f.exitcode != EXIT_PREEMPTED for f in failures):
        return failure_code((errors or failures)[0].exitcode)
    return EXIT_PREEMPTED


def _ended(rank: int, code: int) -> str:
    """How a worker torchrun counts as failed ended: saved, stopped, or failed."""
    if code == EXIT_PREEMPTED:
        return f"rank {rank} stopped as on a stop signal (exit 75)"
    if code == -signal.SIGTERM:
        return f"rank {rank} stopped (SIGTERM) when another rank ended"
    if code < 0:
        return f"a worker failed: rank {rank} {how_it_ended(code)}"
    return f"a worker failed: rank {rank} exited with code {code}"


def port_taken(exc: BaseException) -> bool:
    return "EADDRINUSE" in str(exc)


@contextlib.contextmanager
def _workers_held() -> Iterator[None]:
    """Within, torchrun starts each worker with the stop signals held (`preemption.held`), by
    wrapping its `SubprocessHandler._popen` (a private method: where a torch has none, the
    workers start as before)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    popen = getattr(SubprocessHandler, "_popen", None)
    if popen is None:
        yield
        return

    def popen_held(self: SubprocessHandler, *args: Any, **kwargs: Any) -> Any:
        with preemption.held():
            return popen(self, *args, **kwargs)

    SubprocessHandler._popen = popen_held  # type: ignore[method-assign]
    try:
        yield
    finally:
        SubprocessHandler._popen = popen  # type: ignore[method-assign]


@contextlib.contextmanager
def _first_signal_only() -> Iterator[None]:
    """torchrun stops its workers on a signal (raising `SignalException` in its own handler)
    and waits for them; a second signal would cut that wait short and kill workers in the middle
    of their checkpoint. Here torchrun acts on the first stop signal only; a second SIGINT
    (Ctrl-C twice) aborts: the workers die with this process."""
    from torch.distributed.elastic.multiprocessing import SignalException, api

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if preemption.is_abort(signum):
            preemption.abort()
        if preemption.requested() is None:
            preemption.note(signum)
            raise SignalException(f"got signal {signum}", sigval=signal.Signals(signum))

    handler = api._terminate_process_handler
    api._terminate_process_handler = on_signal
    try:
        yield
    finally:
        api._terminate_process_handler = handler


def import_torchrun() -> None:
    """Import torchrun (seconds: torch), so that a caller can look for a stop signal that came
    meanwhile before any worker starts; a PrimusError without PyTorch."""
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError:
        raise PrimusError(
            "starting several workers needs PyTorch, which is not installed",
            hint="pip install torch (or the backend package, which brings it)",
        ) from None


def run_torchrun(args: list[str], signals_held: bool = False) -> int:
    """Run torchrun in this process; return 0, or `failure_code` of the first failure.
    `signals_held`: the workers start with the stop signals blocked (`preemption.held`), for a
    command that unblocks them once it handles them (Primus's CLI)."""
    import_torchrun()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    print(f"[primus] torchrun {' '.join(args)}", file=sys.stderr)
    # torchrun's own log folder (/tmp/torchelastic_*: the workers' error files) would outlive it
    log_dir = tempfile.mkdtemp(prefix="primus-torchrun-")
    args = [f"--log-dir={log_dir}", *args]
    os.environ[LAUNCHER_PID] = str(os.getpid())  # torchrun passes it on to the workers
    try:
        with _first_signal_only(), _workers_held() if signals_held else contextlib.nullcontext():
            torchrun.main(args)
    except ChildFailedError as exc:  # each worker has reported its own error already
        for rank, failure in sorted(exc.failures.items()):
            print(f"[primus] {_ended(rank, failure.exitcode)}", file=sys.stderr)
        return failed_launch_code(list(exc.failures.values()))
    except SignalException as exc:  # torchrun passed it on and waited for the workers
        print(f"[primus] {signal.Signals(exc.sigval).name}: the workers stopped", file=sys.stderr)
        return 128 + exc.sigval
    finally:
        del os.environ[LAUNCHER_PID]  # not for what this process starts later
        forget_reports()
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0
