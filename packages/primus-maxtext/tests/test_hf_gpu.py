"""On the GPU: a random HF model of Llama-3.2-1B's published shape, imported into MaxText at the
start of `primus train` (`init_from`) with the 1B recipe (bf16 activations, sequence 4096,
synthetic data; cuDNN's flash attention, patch maxtext.cudnn_attention), trains 20 steps; step
1's loss is transformers' loss (bf16, on the GPU) on the same batch, MaxText's synthetic one,
within bf16's tolerance."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from primus.testing.hf_models import make_published_model
from primus.testing.runs import losses, primus, train_run

pytestmark = pytest.mark.gpu
RECIPE = Path(__file__).parents[3] / "configs" / "maxtext" / "llama3.2_1B-pretrain.yaml"


def test_a_llama32_1b_shaped_hf_model_trains_from_its_weights(
    tmp_path: Path, synthetic_batch: Callable[[Path], np.ndarray]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from primus.backends.maxtext.checkpoint.native import preset_from_hf
    from primus.core.checkpoint.hf import read_config

    hf = tmp_path / "hf"
    make_published_model(hf, "llama3.2_1B")
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset_from_hf(read_config(hf))))
    exp = yaml.safe_load(RECIPE.read_text())
    exp["modules"]["pre_trainer"] |= {"model": str(tmp_path / "preset.yaml"),
                                      "init_from": {"hf": str(hf)}}  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    run_dir = train_run(tmp_path / "exp.yaml", tmp_path / "ws", "exp_name=gpu1b", "steps=20")
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "importing on JAX's gpu backend" in log  # the import runs where training does
    assert "[maxtext.cudnn_attention] attention='cudnn_flash_jax'" in log  # cuDNN's attention
    curve = losses(run_dir)
    # synthetic data: the loss of a random 1B model stays near ln(vocab)
    assert sorted(curve) == list(range(1, 21)) and all(map(math.isfinite, curve.values()))

    # the training process has ended: JAX's preallocated GPU memory is free again
    tokens = torch.as_tensor(synthetic_batch(run_dir)).cuda()
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():  # one row at a time; rows of one length: the mean of their means
        rows = [
            torch.nn.functional.cross_entropy(model(row[None, :-1]).logits[0].float(), row[1:])
            for row in tokens
        ]
    reference = float(torch.stack(rows).mean())
    print(f"step 1: {curve[1]:.5f}, transformers {reference:.5f}")
    assert curve[1] == pytest.approx(reference, rel=5e-3)  # MaxText's own init: far off

    # `primus checkpoint import` alone converts on the host: no CUDA start-up, less memory
    alone = primus("checkpoint", "import", "--hf", str(hf), "--config", str(tmp_path / "exp.yaml"),
                   "exp_name=alone", PRIMUS_WORKSPACE=str(tmp_path / "ws"))  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "importing on JAX's cpu backend" in alone.stderr
