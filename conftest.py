"""Repository-wide pytest setup: one OpenMP thread per process, the longest modules first, and
tests marked `gpu` run only where a GPU is visible."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

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

# The modules that take longest (`tools/test_budget.py` on a CI run's JUnit report), longest
# first; the rest follow in their collection order. With each module whole on one xdist worker
# (pyproject: --dist loadfile --no-loadscope-reorder), the two workers then end on short
# modules together, not one of them on a long one while the other waits.
LONGEST_FIRST = (
    "packages/primus-megatron/tests/test_reliability.py",
    "tests/test_multinode.py",
    "packages/primus-torchtitan/tests/test_reliability.py",
    "packages/primus-maxtext/tests/test_reliability.py",
    "packages/primus-torchtitan/tests/test_posttrain.py",
    "packages/primus-megatron/tests/test_posttrain.py",
    "packages/primus-turbo-kernels/tests/test_megatron_turbo.py",
    "packages/primus-maxtext/tests/test_posttrain.py",
    "packages/primus-torchtitan/tests/test_training.py",
    "packages/primus-megatron/tests/test_training.py",
    "packages/primus-maxtext/tests/test_training.py",
    "packages/primus-turbo-kernels/tests/test_torchtitan_turbo.py",
    "tests/test_corpus_parity.py",
    "packages/primus-megatron/tests/test_hf_checkpoints.py",
    "packages/primus-maxtext/tests/test_hf_checkpoints.py",
)


def _gpu_visible() -> bool:
    """Without importing torch: an NVIDIA or AMD device node and its driver tool."""
    nvidia = os.path.exists("/dev/nvidiactl") and shutil.which("nvidia-smi") is not None
    return nvidia or (os.path.exists("/dev/kfd") and shutil.which("rocm-smi") is not None)


def _rank(item: pytest.Item) -> int:
    module = item.nodeid.split("::")[0]
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a module's tests stay together, in their order
    if _gpu_visible():
        return
    skip = pytest.mark.skip(reason="marked gpu: no GPU visible (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
