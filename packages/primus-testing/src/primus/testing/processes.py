"""Watching real processes in tests (Linux /proc): which are still alive after a signal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Running: present and not a zombie waiting to be reaped."""
    try:
        return " Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except (FileNotFoundError, IndexError):
        return False


def left_alive(pids: list[int], timeout_s: float = 10) -> list[int]:
    """The pids still alive `timeout_s` after this call (sooner once all are gone); each of
    them is then killed, so that a failing test leaves nothing behind."""
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left
