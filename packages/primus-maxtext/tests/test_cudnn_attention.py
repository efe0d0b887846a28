"""maxtext.cudnn_attention: the GPU recipe's MaxText config, resolved here on a CPU machine.
No NVIDIA driver is visible here, so the test points the patch's driver check at a file it
makes; the GPU runs are in docs/benchmarks/maxtext.md."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from primus.backends.maxtext.devices import cudnn_attention
from primus.core.patches.rebind import restore_all
from primus.core.runtime.primus_runtime import PrimusRuntime

RECIPE = Path(__file__).parents[3] / "configs" / "maxtext" / "llama3.2_1B-pretrain.yaml"


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    restore_all()


def attention(monkeypatch: pytest.MonkeyPatch, driver: Path, *overrides: str) -> str:
    """The `attention` MaxText resolves for the recipe (with `overrides`), `driver` standing
    for the NVIDIA driver's node."""
    monkeypatch.setattr(cudnn_attention, "NVIDIA_DRIVER", str(driver))
    return PrimusRuntime(RECIPE, list(overrides)).backend_args().config["attention"]


def test_an_nvidia_gpu_runs_cudnn_flash_attention(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    driver = tmp_path / "nvidiactl"
    driver.touch()
    assert attention(monkeypatch, driver) == "cudnn_flash_jax"
    assert attention(monkeypatch, driver, "attention=flash") == "flash"  # the user's choice
    assert attention(monkeypatch, driver, "hardware=cpu") == "autoselected"


def test_without_an_nvidia_driver_maxtext_autoselects(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert attention(monkeypatch, tmp_path / "absent") == "autoselected"
