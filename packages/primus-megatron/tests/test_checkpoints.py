"""`primus checkpoint preset` on Megatron: a preset derived from Llama 3.2 1B's published
config.json. (`inspect` is tested on the HF-initialised run of test_hf_checkpoints.py.)"""

from pathlib import Path

import pytest

from primus.testing.checkpoints import derived_preset, resolved_model
from primus.testing.hf_models import HF_CONFIGS

ARCHITECTURE = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "untie_embeddings_and_output_weights", "layernorm_epsilon", "rotary_base",
    "use_rope_scaling", "rope_scaling_factor",
)  # fmt: skip


@pytest.mark.slow
def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("megatron", HF_CONFIGS["llama3.2_1B"], tmp_path)
    ours = resolved_model("megatron", "megatron_pretrain", derived.name, tmp_path)
    shipped = resolved_model("megatron", "megatron_pretrain", "llama3.2_1B", tmp_path)
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}


def test_the_fixed_rope_scaling_read_from_megatrons_source_is_what_it_runs() -> None:
    """`checkpoint preset` reads Megatron's fixed Llama-3 scaling constants from its source,
    without importing it; they are the defaults of the function Megatron calls."""
    import inspect

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from primus.backends.megatron.checkpoint.native import FIXED_SCALING, fixed_rope_scaling

    fixed = inspect.signature(RotaryEmbedding._apply_scaling).parameters
    assert fixed_rope_scaling() == {k: float(fixed[k].default) for k in FIXED_SCALING}
