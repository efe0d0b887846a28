"""A run out of memory (a GPU's, or the host's on a CPU run) ends with one message for the run
naming the allocation that failed and what would make it fit, not a traceback per rank."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from primus.core.errors import PrimusError, linked

# How the frameworks say it: PyTorch's CUDA and CPU allocators, XLA's (JAX), Python's own
_SIGNS = (
    re.compile(r"out of memory", re.IGNORECASE),
    re.compile(r"can't allocate memory"),
    re.compile(r"RESOURCE_EXHAUSTED"),
)
_BYTES = re.compile(r"allocat\w* (?:memory: you tried to allocate )?(\d+) bytes")
HINT = (
    "a smaller micro batch or sequence length, more tensor or pipeline parallelism, "
    "activation recomputation, or no CUDA graph (its pool holds the activations once more); "
    "`primus projection memory --config EXPERIMENT` estimates what a layout needs before it runs"
)


class OutOfMemoryError(PrimusError):
    """Memory ran out during a run. Exit code 1; the ranks that hit it report it once."""

    def report_key(self) -> str:
        return f"{self.label}: out of memory"


def _size(text: str) -> str:
    """The upstream message's first line, with a byte count written in GiB."""
    if not text.strip():
        return "an allocation failed (MemoryError)"
    line = text.strip().splitlines()[0]
    found = _BYTES.search(line)
    if found:
        line += f" ({int(found.group(1)) / 2**30:.1f} GiB)"
    return line


def out_of_memory(
    exc: BaseException,
    rank: int | None = None,
    projected: Callable[[], float | None] = lambda: None,
) -> OutOfMemoryError | None:
    """The OutOfMemoryError behind `exc` (in it or what it holds), or None. A PrimusError is its
    own report: None. `projected`: the layout's projected GiB on its most loaded GPU, asked
    for only when memory ran out (None: no projection)."""
    if isinstance(exc, PrimusError):
        return exc if isinstance(exc, OutOfMemoryError) else None
    for held in linked(exc):
        text = str(held)
        if isinstance(held, MemoryError) or (
            type(held).__name__ in ("OutOfMemoryError", "RuntimeError", "XlaRuntimeError",
                                    "JaxRuntimeError")
            and any(sign.search(text) for sign in _SIGNS)
        ):  # fmt: skip
            where = f" on rank {rank}" if rank is not None else ""
            gib = projected()
            figure = (f"; the projection of this layout: {gib:,.1f} GiB on its most loaded GPU"
                      if gib is not None else "")  # fmt: skip
            return OutOfMemoryError(f"out of memory{where}: {_size(text)}{figure}", hint=HINT)
    return None


def projected_gib(adapter: Any, args: Any, applied: frozenset[str]) -> float | None:
    """The memory projection of a run's layout (its backend `args`, the patches `applied`), in
    GiB on its most loaded GPU; None where the backend projects none or the args make no job."""
    from primus.core.backend.capabilities import provides
    from primus.core.launch.dist_env import get_torchrun_env
    from primus.core.projection import project

    if args is None or not provides(adapter, "memory-projection"):
        return None
    try:
        job = adapter.training_job(args, get_torchrun_env().world_size, applied)
        return project(job).total / 2**30
    except Exception:  # the run's own failure is the one to tell
        return None
