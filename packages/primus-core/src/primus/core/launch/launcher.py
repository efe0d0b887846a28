"""What every launch shares: the launch's shape and its rendezvous port, the bond of a worker to
its launcher (it dies with it), messages the ranks report once, and the launcher's exit code
for a failed worker's. Workers start through `workers.launch_workers`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from primus.core.errors import linked
from primus.core.launch.ports import free_port
from primus.core.launch.reaper import die_with_parent, processes, start_group_reaper
from primus.core.reliability.preemption import EXIT_PREEMPTED

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


# What a collective raises when a peer is gone (gloo, NCCL, the rendezvous store), by the
# error's type or words.
_PEER_GONE = re.compile(
    r"connection|peer|socket|broken pipe|gloo|nccl|timed? ?out|Dist\w*Error", re.IGNORECASE
)


def peer_gone(exc: BaseException) -> bool:
    """Whether `exc`, or an error it holds (`linked`: its causes, an exception group's members,
    DCP's failures of each rank), reads as a collective whose peer is gone (and not as a
    failure of this worker's own, which keeps its message and traceback)."""
    return any(_PEER_GONE.search(f"{type(e).__name__}: {e}") for e in linked(exc))


def another_worker_ended(wait_s: float = 1.0) -> bool:
    """In a worker of a Primus launch whose run failed: whether another worker of this node had
    ended first (looked for up to `wait_s`, as one that was killed closes its connections
    before it has ended). Then this failure follows from that one (a collective whose peer is
    gone), and the launcher names the worker that ended. False outside a launch."""
    launcher = os.environ.get(LAUNCHER_PID)
    workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not launcher or workers < 2 or not os.path.isdir("/proc/self"):
        return False
    deadline = time.monotonic() + wait_s
    while sum(p.ppid == int(launcher) and not p.ended for p in processes().values()) >= workers:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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


def failure_code(worker_code: int) -> int:
    """The launcher's exit code for a failed worker's: 2 (bad config) and 75 (preempted, with
    a checkpoint) stay, the rest is 1."""
    return worker_code if worker_code in (2, EXIT_PREEMPTED) else 1


def how_it_ended(code: int) -> str:
    """A worker's end as a clause: `exited 3`, or `was killed by SIGKILL` for a negative code
    (a real-time signal by its number)."""
    if code >= 0:
        return f"exited {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"
