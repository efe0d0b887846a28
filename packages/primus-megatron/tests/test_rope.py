"""Each model preset's rotary frequencies, as Megatron builds them, against transformers'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primus.testing.hf_models import HF_CONFIGS, hf_inv_freq
from primus.testing.runs import preset_args

PRESETS = Path(__file__).parents[1] / "src/primus/backends/megatron/configs/models"
MODELS = sorted(p.stem for p in PRESETS.glob("*.yaml") if not p.stem.startswith("tiny"))


def test_every_model_preset_has_its_hf_config() -> None:
    assert MODELS and set(MODELS) <= set(HF_CONFIGS)


@pytest.mark.parametrize("model", MODELS)
def test_rotary_frequencies_match_transformers(model: str, tmp_path: Path) -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from primus.backends.megatron.providers import rotary_kwargs

    args = preset_args(tmp_path, "megatron", "megatron_pretrain", model, device="cpu")
    rope = RotaryEmbedding(  # as GPTModel builds it from the args (providers.model_provider)
        kv_channels=args.kv_channels,
        rotary_interleaved=args.rotary_interleaved,
        use_cpu_initialization=True,
        **rotary_kwargs(args),
    )
    np.testing.assert_allclose(rope.inv_freq.double().numpy(), hf_inv_freq(model), rtol=1e-6)


def test_mixtral_router_aux_loss_weight_is_hf(tmp_path: Path) -> None:
    args = preset_args(tmp_path, "megatron", "megatron_pretrain", "mixtral_8x7B", device="cpu")
    assert args.moe_aux_loss_coeff == HF_CONFIGS["mixtral_8x7B"]["router_aux_loss_coef"]
