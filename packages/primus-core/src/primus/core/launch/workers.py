"""Starting the workers of a launch through the backend's launcher."""

from __future__ import annotations

import sys

from primus.core.errors import PrimusError
from primus.core.launch.launcher import LAUNCHERS, PORT_TRIES, Launch, follow_uv
from primus.core.launch.spawner import spawn
from primus.core.launch.torchrun import import_torchrun, port_taken, run_torchrun, torchrun_args


def load_launcher(launcher: str) -> None:
    """Import what `launch_workers` needs of `launcher` (torchrun: torch, seconds)."""
    if launcher == "torchrun":
        import_torchrun()


def launch_workers(launcher: str, worker_argv: list[str], launch: Launch) -> int:
    """Run `python -m primus.cli <worker_argv>` in every worker, through the backend's launcher.
    Each starts with the stop signals held (`preemption.held`) until its CLI handles them.

    Under torchrun, a rendezvous port that Primus chose and that another process took before
    torchrun bound it (EADDRINUSE) is replaced by a new free port, up to PORT_TRIES times."""
    follow_uv()
    if launcher == "spawn":
        return spawn([sys.executable, "-m", "primus.cli", *worker_argv], launch, signals_held=True)
    if launcher == "torchrun":
        for attempt in range(1, PORT_TRIES + 1):
            try:
                return run_torchrun(torchrun_args(worker_argv, launch), signals_held=True)
            except Exception as exc:
                if launch.master_port or launch.nnodes > 1 or not port_taken(exc):
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
