"""`primus checkpoint preset` and `inspect` on MaxText: a preset derived from Mixtral 8x7B's
published config.json, and an orbax checkpoint written by a real CPU run."""

from pathlib import Path

import pytest

from primus.core.testing.checkpoints import derived_preset, inspect_json, resolved_model
from primus.core.testing.runs import train_run

RECIPE = Path(__file__).parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
# mistralai/Mixtral-8x7B-v0.1 config.json, as published
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
    "rms_norm_eps": 1e-05, "rope_theta": 1e6, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32000,
}  # fmt: skip
ARCHITECTURE = (
    "decoder_block", "base_emb_dim", "base_num_decoder_layers", "base_num_query_heads",
    "base_num_kv_heads", "head_dim", "base_mlp_dim", "base_moe_mlp_dim", "num_experts",
    "num_experts_per_tok", "vocab_size", "logits_via_embedding", "normalization_layer_epsilon",
    "rope_max_timescale",
)  # fmt: skip


@pytest.mark.slow
def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("maxtext", MIXTRAL_8X7B, tmp_path)
    ours = resolved_model("maxtext", "maxtext_pretrain", derived.name, tmp_path)
    shipped = resolved_model("maxtext", "maxtext_pretrain", "mixtral_8x7B", tmp_path)
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}
    assert ours["load_balance_loss_weight"] == 0.02  # HF's router_aux_loss_coef


@pytest.mark.slow
def test_inspect_an_orbax_checkpoint_from_a_real_run(tmp_path: Path) -> None:
    run_dir = train_run(RECIPE, tmp_path, "exp_name=ckpt", "steps=4",
                        "enable_checkpointing=true", "checkpoint_period=2")  # fmt: skip
    info = inspect_json(run_dir / "checkpoints")
    # orbax counts steps from 0: 0, 2 and the final 3
    assert (info["backend"], info["iteration"], info["iterations_saved"]) == (
        "maxtext",
        3,
        [0, 2, 3],
    )
    assert info["model"] == {"vocab_size": 256, "emb_dim": 64, "num_decoder_layers": 2,
                             "num_query_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                             "logits_via_embedding": False, "scan_layers": True}  # fmt: skip
    assert info["parallel"] == {"saving_processes": 1}
    assert info["provenance"]["run_dir"] == str(run_dir.resolve())
