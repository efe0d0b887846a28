"""What this host has, read from /proc: its name, CPU model and cores, total and available
memory."""

from __future__ import annotations

import os
import socket
from typing import Any

GIB = 1 << 30


def _proc_field(path: str, name: str) -> str | None:
    try:
        with open(path) as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def meminfo_bytes(name: str) -> int | None:
    """A /proc/meminfo field (`MemAvailable`, ...) in bytes; None where there is none."""
    value = _proc_field("/proc/meminfo", name)  # "16314248 kB"
    return int(value.split()[0]) * 1024 if value else None


def _meminfo_gib(name: str) -> float | None:
    value = meminfo_bytes(name)
    return round(value / GIB, 1) if value is not None else None


def host_info() -> dict[str, Any]:
    """This host's name, CPU model and cores, total and available memory (GiB)."""
    return {
        "host": socket.gethostname(),
        "cpu": _proc_field("/proc/cpuinfo", "model name"),
        "cpu_cores": os.cpu_count(),
        "mem_total_gib": _meminfo_gib("MemTotal"),
        "mem_available_gib": _meminfo_gib("MemAvailable"),
    }
