"""`primus checkpoint preset` on Megatron: a preset derived from Llama 3.2 1B's published
config.json. (`inspect` is tested on the HF-initialised run of test_hf_checkpoints.py.)"""

from pathlib import Path

import pytest

from primus.core.testing.checkpoints import derived_preset, resolved_model

# meta-llama/Llama-3.2-1B config.json, as published
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "vocab_size": 128256, "attention_bias": False, "mlp_bias": False,
}  # fmt: skip
ARCHITECTURE = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "untie_embeddings_and_output_weights", "layernorm_epsilon", "rotary_base",
    "use_rope_scaling", "rope_scaling_factor",
)  # fmt: skip


@pytest.mark.slow
def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("megatron", LLAMA32_1B, tmp_path)
    ours = resolved_model("megatron", "megatron_pretrain", derived.name, tmp_path)
    shipped = resolved_model("megatron", "megatron_pretrain", "llama3.2_1B", tmp_path)
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}
