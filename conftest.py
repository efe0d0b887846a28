"""Repository-wide pytest setup: tests marked `gpu` run only where a GPU is visible, and the
slowest modules are collected first.

Under `--dist loadfile` each module runs whole on one worker, handed out in collection order;
a slow module handed out last leaves the other worker idle to the end. Collected longest first
(the seconds tools/test_budget.py recorded in tests/module_seconds.json; a module not recorded
counts as the median), the workers finish close together. The order inside a module is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).parent
MODULE_SECONDS = ROOT / "tests" / "module_seconds.json"


def _gpu_visible() -> bool:
    """Without importing torch: an NVIDIA or AMD device node and its driver tool."""
    nvidia = os.path.exists("/dev/nvidiactl") and shutil.which("nvidia-smi") is not None
    return nvidia or (os.path.exists("/dev/kfd") and shutil.which("rocm-smi") is not None)


def _slowest_modules_first(items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = json.loads(MODULE_SECONDS.read_text())
    unknown = statistics.median(seconds.values())

    def module(item: pytest.Item) -> str:
        return item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""

    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module(item), index)
    items.sort(key=lambda item: (-seconds.get(module(item), unknown), first_seen[module(item)]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slowest_modules_first(items)
    if _gpu_visible():
        return
    skip = pytest.mark.skip(reason="marked gpu: no GPU visible (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
