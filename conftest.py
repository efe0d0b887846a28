"""Repository-wide pytest setup: one OpenMP thread per process, no module hidden from the test
processes, and tests marked `gpu` run only where a GPU is visible."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from primus.core.runtime import resolution

# The xdist workers share the machine's cores, and most tests start torch processes beside each
# other. With OpenMP's default of one thread per core they oversubscribe the cores, and the
# threads' spin-waits slow every run down (docs/testing.md: two quickstart runs side by side on
# 2 cores, 97 s; 24 s with one thread each). Set here, before a worker or a test imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The backends' parameter schemas are cached in one folder for the whole session (its workers
# inherit it), not in the user's cache: each test session reads every schema live once. The
# process that made the folder removes it at the end.
_CACHE_DIR = None
if "PRIMUS_CACHE_DIR" not in os.environ:
    _CACHE_DIR = os.environ["PRIMUS_CACHE_DIR"] = tempfile.mkdtemp(prefix="primus-test-cache-")


# A test process runs every backend in turn, and a module one backend hides from the processes
# that run it (its adapter's unused_modules: torch, from MaxText's) another one imports. The
# runs' own processes (subprocesses, forks) still hide them.
resolution.hide_modules = lambda names: None


def _gpu_visible() -> bool:
    """Without importing torch: an NVIDIA or AMD device node and its driver tool."""
    nvidia = os.path.exists("/dev/nvidiactl") and shutil.which("nvidia-smi") is not None
    return nvidia or (os.path.exists("/dev/kfd") and shutil.which("rocm-smi") is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_visible():
        return
    skip = pytest.mark.skip(reason="marked gpu: no GPU visible (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
