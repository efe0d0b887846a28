"""Repository-wide pytest setup: tests marked `gpu` run only where a GPU is visible."""

from __future__ import annotations

import os
import shutil

import pytest


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
