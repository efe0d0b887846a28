"""maxtext.gpu_attention_sharding: MaxText's real AttentionOp on 4 host devices, in a
subprocess (the device count is fixed when JAX starts). tokamax's Triton kernel cannot run on
a CPU, so the test lets the patch act there, where MaxText's dot-product attention takes the
call (see sharded_attention.py); the GPU run is in docs/benchmarks/eight-gpus.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_each_device_attends_its_own_sequences_with_the_same_result(tmp_path: Path) -> None:
    script = Path(__file__).with_name("sharded_attention.py")
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4
    assert result["reference_batches"] == [4]  # MaxText's call: every device, every sequence
    assert result["sharded_batches"] == [1] and result["shard_map"]
    assert result["max_abs_difference"] < 1e-5


@pytest.mark.parametrize(
    ("hardware", "attention", "applies"),
    [("gpu", "autoselected", True), ("gpu_multiprocess", "flash", True),
     ("gpu", "dot_product", False), ("cpu", "autoselected", False)],
)  # fmt: skip
def test_the_patch_is_for_gpu_flash_attention(hardware: str, attention: str, applies: bool) -> None:
    from primus.backends.maxtext.devices.gpu_attention_sharding import _gpu_flash
    from primus.core.patches import PatchContext

    params = {"hardware": hardware, "attention": attention}
    assert _gpu_flash(PatchContext("maxtext", "before_train", "0.2.5", "0", params)) is applies
