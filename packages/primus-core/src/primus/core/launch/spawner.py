"""Primus's own spawner, for backends that declare `launcher = "spawn"`: torchrun's variables
for each worker, no torch, the first failure stops the others, stop signals passed on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from primus.core.launch.launcher import (
    LAUNCHER_PID,
    Launch,
    failure_code,
    forget_reports,
    how_it_ended,
)
from primus.core.launch.ports import reserve_port
from primus.core.reliability import preemption
from primus.core.reliability.preemption import EXIT_PREEMPTED, GRACE_S, SIGNALS


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
    deadline for the workers), 128 + the signal when a worker died of it, ended without a
    checkpoint (its own error said why), or the deadline passed."""
    while True:
        codes = [w.poll() for w in workers]
        failed = [
            (i, code) for i, code in enumerate(codes) if code not in (None, 0, EXIT_PREEMPTED)
        ]
        if failed:
            # a worker that ended by its own SIGTERM did so after another had ended: not it
            i, code = next((f for f in failed if f[1] != -signal.SIGTERM), failed[0])
            if stopping:  # killed by the signal passed on, or stopped unsaved: no checkpoint
                name = signal.Signals(stopping[0][0]).name
                print(f"[primus] {name}: rank {first_rank + i} {how_it_ended(code)} without "
                      "a checkpoint", file=sys.stderr)  # fmt: skip
                return 128 + stopping[0][0]
            how = f"exited with code {code}" if code >= 0 else how_it_ended(code)
            print(
                f"[primus] a worker failed: rank {first_rank + i} {how}; stopping the others",
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


def spawn(
    command: list[str], launch: Launch, grace_s: float = 10.0, poll_s: float = 0.1,
    signals_held: bool = False,
) -> int:  # fmt: skip
    """Run `command` in `launch.nproc_per_node` processes with torchrun's variables, no torch.

    Nothing listens on MASTER_PORT: it is the workers' own to use (a JAX coordinator, say).
    A port Primus picks (one node, no `master_port`) is held with `reserve_port` until the
    workers end, so that no other process takes it first.
    The first worker to fail stops the others; returns 0, or `failure_code` of the first failure.
    SIGTERM and SIGUSR1 are passed on to the workers, which stop at a step with a checkpoint
    (exit 75); they get GRACE_S seconds for it. Each node runs this with its `node_rank`.
    `signals_held`: the workers start with the stop signals blocked (`preemption.held`), for a
    command that unblocks them once it handles them (Primus's CLI).
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
            f"to {GRACE_S} s for them to stop (a worker that trains saves its step first)",
            file=sys.stderr,
        )

    previous = {sig: signal.signal(sig, pass_on) for sig in SIGNALS}
    try:
        with preemption.held() if signals_held else contextlib.nullcontext():
            for local_rank in range(launch.nproc_per_node):
                env = {**worker_env(launch, local_rank, addr, port), LAUNCHER_PID: str(os.getpid())}
                # Each worker leads its own process group: stopping it stops what it forked.
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
