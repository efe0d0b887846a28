"""Starting worker processes: through torchrun (torch.distributed.run, imported only here), or
through Primus's own spawner for backends that declare `launcher = "spawn"` (no torch needed)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from primus.core.errors import PrimusError
from primus.core.launch.reaper import die_with_parent, start_group_reaper
from primus.core.reliability import preemption
from primus.core.reliability.preemption import EXIT_PREEMPTED, GRACE_S, SIGNALS

LAUNCHERS = ("torchrun", "spawn")
LAUNCHER_PID = "PRIMUS_LAUNCHER_PID"  # set in each worker's environment: the launcher's pid
PORT_TRIES = 5  # auto-chosen rendezvous ports tried when another process took the port first


def _reports(launcher: str | int) -> Path:
    return Path(tempfile.gettempdir()) / f"primus-{launcher}-reported"


def report_once(text: str) -> bool:
    """True unless another worker of this launch has reported `text` already: every rank reaches
    the same config error, and the console shows it once (a worker whose error differs shows its
    own). Outside a launch, always True."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher:
        return True
    folder = _reports(launcher)
    try:
        folder.mkdir(exist_ok=True)
        (folder / hashlib.sha256(text.encode()).hexdigest()[:16]).touch(exist_ok=False)
    except FileExistsError:
        return False
    except OSError:  # no temporary folder: every worker reports
        return True
    return True


def forget_reports() -> None:
    """Remove this launcher's record of what its workers reported."""
    folder = _reports(os.getpid())
    for report in folder.glob("*"):
        report.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


_forked_on_main_thread = False


def _before_fork() -> None:
    global _forked_on_main_thread
    _forked_on_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # The death signal follows the thread that forked: only a fork from the main thread (which
    # lives as long as the worker) can tie the child to the worker without killing it early.
    if _forked_on_main_thread:
        die_with_parent(signal.SIGKILL)


def bind_worker_to_launcher() -> None:
    """In a worker that a Primus launcher started: die (SIGKILL) when the launcher dies, even by
    SIGKILL, and make the processes this worker forks (data loaders, async checkpoint savers)
    die with it. Exits at once if the launcher is already gone. Nothing outside a launch."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or "LOCAL_RANK" not in os.environ or not die_with_parent(signal.SIGKILL):
        return
    if os.getppid() != int(launcher):  # the launcher died before the death signal was set
        os._exit(128 + signal.SIGKILL)
    if os.getpgrp() == os.getpid():  # this worker leads its process group (both launchers)
        start_group_reaper()
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _parent_is_uv() -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{os.getppid()}/exe")) == "uv"
    except OSError:
        return False


def follow_uv() -> None:
    """Under `uv run`, stop (SIGTERM) when uv dies: uv forwards SIGTERM and SIGINT, but a
    SIGKILL to uv would otherwise leave this launcher and its workers running. Not done under
    a shell or nohup, where outliving the parent is wanted."""
    parent = os.getppid()
    if _parent_is_uv() and die_with_parent(signal.SIGTERM) and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reserve_port() -> socket.socket:
    """A socket bound to a free port with SO_REUSEPORT, for the launcher to hold while its
    workers run: a process that does not share ports cannot take it (EADDRINUSE), while the
    workers' own server binds it beside this socket (JAX's gRPC coordinator sets
    SO_REUSEPORT). Nothing listens on it, so every connection reaches the workers' server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@dataclass(frozen=True)
class Launch:
    """Where workers start: how many per node, how many nodes, this node, node 0's address."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    def rendezvous(self) -> tuple[str, int]:
        """The master address and port: as given, else this host and a free port on one node."""
        port = self.master_port or (free_port() if self.nnodes == 1 else 29500)
        return self.master_addr or "127.0.0.1", port


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


def failure_code(worker_code: int) -> int:
    """The launcher's exit code for a failed worker's: 2 (bad config) and 75 (preempted, with
    a checkpoint) stay, the rest is 1."""
    return worker_code if worker_code in (2, EXIT_PREEMPTED) else 1


def failed_launch_code(failures: list[Any]) -> int:
    """The launcher's exit code for torchrun's failed workers (its `ProcessFailure`s): the
    `failure_code` of the first that did not exit 75. torchrun may record, in one pass, the
    worker it stopped (exit 75 after its SIGTERM) beside, or before, the one that failed."""
    failures = sorted(failures, key=lambda failure: failure.timestamp)
    errors = [f for f in failures if f.exitcode != EXIT_PREEMPTED] or failures
    return failure_code(errors[0].exitcode)


def _port_taken(exc: BaseException) -> bool:
    return "EADDRINUSE" in str(exc)


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


def run_torchrun(args: list[str]) -> int:
    """Run torchrun in this process; return 0, or `failure_code` of the first failure."""
    try:
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except ImportError:
        raise PrimusError(
            "starting several workers needs PyTorch, which is not installed",
            hint="pip install torch (or the backend package, which brings it)",
        ) from None
    print(f"[primus] torchrun {' '.join(args)}", file=sys.stderr)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # torchrun passes it on to the workers
    try:
        with _first_signal_only():
            torchrun.main(args)
    except ChildFailedError as exc:  # each worker has reported its own error already
        for rank, failure in sorted(exc.failures.items()):
            print(
                f"[primus] rank {rank} stopped with a checkpoint (exit 75)"
                if failure.exitcode == EXIT_PREEMPTED
                else f"[primus] a worker failed: rank {rank} exited with code {failure.exitcode}",
                file=sys.stderr,
            )
        return failed_launch_code(list(exc.failures.values()))
    except SignalException as exc:  # torchrun passed it on and waited for the workers
        print(f"[primus] {signal.Signals(exc.sigval).name}: the workers stopped", file=sys.stderr)
        return 128 + exc.sigval
    finally:
        del os.environ[LAUNCHER_PID]  # not for what this process starts later
        forget_reports()
    return 0


def worker_env(launch: Launch, local_rank: int, addr: str, port: int) -> dict[str, str]:
    """The variables torchrun gives a worker (static rendezvous)."""
    values = {
        "RANK": launch.node_rank * launch.nproc_per_node + local_rank,
        "WORLD_SIZE": launch.nnodes * launch.nproc_per_node,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": launch.nproc_per_node,
        "GROUP_RANK": launch.node_rank,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }
    return {name: str(value) for name, value in values.items()}


def _wait(
    workers: list[subprocess.Popen[bytes]],
    first_rank: int,
    poll_s: float,
    stopping: list[tuple[int, float]],
) -> int:
    """0 when every worker succeeded, 75 when they all ended and one was preempted; at the first
    failure, its `failure_code`. After a preemption signal (`stopping`: the signal and the
    deadline for the workers), 128 + the signal when a worker died of it or the deadline
    passed."""
    while True:
        codes = [w.poll() for w in workers]
        for i, code in enumerate(codes):
            if code not in (None, 0, EXIT_PREEMPTED):
                if stopping and code < 0:  # killed by the signal passed on: no checkpoint
                    return 128 + stopping[0][0]
                print(
                    f"[primus] a worker failed: rank {first_rank + i} exited with code {code}; "
                    "stopping the others",
                    file=sys.stderr,
                )
                return failure_code(code)
        if None not in codes:
            return EXIT_PREEMPTED if EXIT_PREEMPTED in codes else 0
        if stopping and time.monotonic() > stopping[0][1]:
            print(
                f"[primus] the workers did not stop within {GRACE_S} s of the signal; killing them",
                file=sys.stderr,
            )
            return 128 + stopping[0][0]
        time.sleep(poll_s)


def _signal_group(worker: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.pid, sig)


def _stop(workers: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM to the workers still running, SIGKILL to those still running `grace_s` later
    (JAX workers ignore SIGTERM). Further SIGTERM/SIGINT cannot cut this short."""
    handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        running = [w for w in workers if w.poll() is None]
        for worker in running:
            _signal_group(worker, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(max(0.0, deadline - time.monotonic()))
        for worker in workers:  # what is left of each group, the processes workers forked too
            _signal_group(worker, signal.SIGKILL)
            worker.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def spawn(command: list[str], launch: Launch, grace_s: float = 10.0, poll_s: float = 0.1) -> int:
    """Run `command` in `launch.nproc_per_node` processes with torchrun's variables, no torch.

    Nothing listens on MASTER_PORT: it is the workers' own to use (a JAX coordinator, say).
    A port Primus picks (one node, no `master_port`) is held with `reserve_port` until the
    workers end, so that no other process takes it first.
    The first worker to fail stops the others; returns 0, or `failure_code` of the first failure.
    SIGTERM and SIGUSR1 are passed on to the workers, which stop at a step with a checkpoint
    (exit 75); they get GRACE_S seconds for it. Each node runs this with its `node_rank`.
    """
    held = reserve_port() if launch.master_port is None and launch.nnodes == 1 else None
    if held is not None:
        launch = replace(launch, master_port=held.getsockname()[1])
    addr, port = launch.rendezvous()
    first = launch.node_rank * launch.nproc_per_node
    print(
        f"[primus] spawning ranks {first}-{first + launch.nproc_per_node - 1} of "
        f"{launch.nnodes * launch.nproc_per_node}, master {addr}:{port}",
        file=sys.stderr,
    )
    workers: list[subprocess.Popen[bytes]] = []
    stopping: list[tuple[int, float]] = []  # the first preemption signal, and the deadline

    def pass_on(signum: int, _: Any) -> None:
        if preemption.is_abort(signum):  # Ctrl-C twice
            for worker in workers:
                _signal_group(worker, signal.SIGKILL)
                worker.wait()
            preemption.abort()
        if stopping:  # the first signal only: a copy (uv passes on what the group got) is none
            return
        preemption.note(signum)  # a worker not started yet finds it in its environment
        for worker in workers:  # the worker alone: its data loaders must live to the checkpoint
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)
        stopping.append((signum, time.monotonic() + GRACE_S))
        print(
            f"[primus] {signal.Signals(signum).name}: passed on to the workers; waiting up "
            f"to {GRACE_S} s for their checkpoint",
            file=sys.stderr,
        )

    previous = {sig: signal.signal(sig, pass_on) for sig in SIGNALS}
    try:
        for local_rank in range(launch.nproc_per_node):
            env = {**worker_env(launch, local_rank, addr, port), LAUNCHER_PID: str(os.getpid())}
            # Each worker leads its own process group, so that stopping it stops what it forked.
            workers.append(
                subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True)
            )
        return _wait(workers, first, poll_s, stopping)
    finally:
        _stop(workers, grace_s)
        forget_reports()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held is not None:
            held.close()


def launch_workers(launcher: str, worker_argv: list[str], launch: Launch) -> int:
    """Run `python -m primus.cli <worker_argv>` in every worker, through the backend's launcher.

    Under torchrun, a rendezvous port that Primus chose and that another process took before
    torchrun bound it (EADDRINUSE) is replaced by a new free port, up to PORT_TRIES times."""
    follow_uv()
    if launcher == "spawn":
        return spawn([sys.executable, "-m", "primus.cli", *worker_argv], launch)
    if launcher == "torchrun":
        for attempt in range(1, PORT_TRIES + 1):
            try:
                return run_torchrun(torchrun_args(worker_argv, launch))
            except Exception as exc:
                if launch.master_port or launch.nnodes > 1 or not _port_taken(exc):
                    raise
                if attempt == PORT_TRIES:
                    raise PrimusError(
                        f"no free rendezvous port after {PORT_TRIES} tries: {exc}",
                        hint="pass --master-port",
                    ) from None
                print(
                    f"[primus] the rendezvous port was taken ({exc}); trying another",
                    file=sys.stderr,
                )
        raise AssertionError("unreachable")
    raise PrimusError(f"unknown launcher '{launcher}' (one of {', '.join(LAUNCHERS)})")
