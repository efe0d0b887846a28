"""Each model preset's rotary frequencies, as MaxText builds them, against transformers'."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from primus.core.patches import restore_all
from primus.testing.hf_models import HF_CONFIGS, hf_inv_freq
from primus.testing.runs import preset_args

PRESETS = Path(__file__).parents[1] / "src/primus/backends/maxtext/configs/models"
TOYS = ("tiny", "tiny_llama3")  # test models: not in HF_CONFIGS
MODELS = sorted(p.stem for p in PRESETS.glob("*.yaml") if p.stem not in TOYS)
PATCHES = "maxtext.config_errors,maxtext.llama3_rope_factor"  # what a config needs here


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    yield
    restore_all()


def maxtext_config(workspace: Path, model: str):
    """MaxText's config of the preset, as the trainer initializes it from Primus's argv."""
    from maxtext.configs import pyconfig

    args = preset_args(workspace, "maxtext", "maxtext_pretrain", model, PATCHES, hardware="cpu")
    return pyconfig.HyperParameters(pyconfig.initialize_pydantic(args.argv))


def test_every_model_preset_has_its_hf_config() -> None:
    assert MODELS and set(MODELS) <= set(HF_CONFIGS)


@pytest.mark.parametrize("model", MODELS)
def test_rotary_frequencies_match_transformers(model: str, tmp_path: Path) -> None:
    from maxtext.layers.attentions import Attention

    config = maxtext_config(tmp_path, model)
    attention = types.SimpleNamespace(  # what Attention.init_rotary_embedding reads
        config=config,
        rope_type=config.rope_type.lower(),
        rope_max_timescale=config.rope_max_timescale,
        head_dim=config.head_dim,
        attention_type=config.attention_type,
        is_vision=False,
        use_mrope=False,
        is_qwen3_hybrid=False,
        partial_rotary_factor=None,
        mesh=None,
        dtype=np.float32,
        rngs=None,
    )
    rope = Attention.init_rotary_embedding(attention)
    timescale = np.asarray(rope.timescale, np.float64).reshape(-1)
    if timescale.size == rope.embedding_dims:  # LLaMARotaryEmbedding: each pair's twice
        timescale = timescale[::2]
    np.testing.assert_allclose(1.0 / timescale, hf_inv_freq(model), rtol=1e-6)


def test_mixtral_router_aux_loss_weight_is_hf(tmp_path: Path) -> None:
    config = maxtext_config(tmp_path, "mixtral_8x7B")
    assert config.load_balance_loss_weight == HF_CONFIGS["mixtral_8x7B"]["router_aux_loss_coef"]
