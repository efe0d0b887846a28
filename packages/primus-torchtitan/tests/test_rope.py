"""Each model preset's rotary frequencies, as TorchTitan builds them, against transformers'."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from primus.testing.hf_models import HF_CONFIGS, hf_inv_freq
from primus.testing.runs import preset_args

PRESETS = Path(__file__).parents[1] / "src/primus/backends/torchtitan/configs/models"
TOYS = ("tiny", "tiny_llama3", "llama3_debug")  # test models: not in HF_CONFIGS
MODELS = sorted(p.stem for p in PRESETS.glob("*.yaml") if p.stem not in TOYS)


def test_every_model_preset_has_its_hf_config() -> None:
    assert MODELS and set(MODELS) <= set(HF_CONFIGS)


def inv_freq(rope_config) -> np.ndarray:
    """The inverse frequencies of the RoPE module TorchTitan builds: its cache's angles at
    position 1 (complex for llama3, cos and sin halves for qwen3)."""
    import torch

    cache = dataclasses.replace(rope_config, max_seq_len=2).build().cache[1]
    if cache.is_complex():
        return torch.angle(cache).double().numpy()
    half = rope_config.dim // 2
    return torch.atan2(cache[2 * half : 3 * half], cache[:half]).double().numpy()


@pytest.mark.parametrize("model", MODELS)
def test_rotary_frequencies_match_transformers(model: str, tmp_path: Path) -> None:
    from torchtitan.models.common.rope import RoPE

    args = preset_args(tmp_path, "torchtitan", "torchtitan_pretrain", model, device="cpu")
    ropes = {id(c): c for _, c, *_ in args.model_spec.traverse(RoPE.Config, recurse=True)}
    assert len(ropes) >= 1
    for rope in ropes.values():
        np.testing.assert_allclose(inv_freq(rope), hf_inv_freq(model), rtol=1e-6)
