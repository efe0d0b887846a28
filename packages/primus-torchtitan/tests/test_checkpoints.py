"""`primus checkpoint preset` and `inspect` on TorchTitan: a preset derived from Llama 3.1 8B's
published config.json, and a DCP checkpoint written by a real CPU run."""

from pathlib import Path

import pytest

from primus.core.testing.checkpoints import derived_preset, inspect_json, resolved_model
from primus.core.testing.hf_models import hf_config
from primus.core.testing.runs import primus, train_run

RECIPE = Path(__file__).parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"
# meta-llama/Llama-3.1-8B config.json, as published (Llama-3 scaling with TorchTitan's factor 8)
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "vocab_size": 128256, "attention_bias": False, "mlp_bias": False,
}  # fmt: skip
ARCHITECTURE = ("family", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim",
                "vocab_size", "rope_theta", "rope_scaling", "rope_scaling_factor", "max_seq_len")  # fmt: skip


@pytest.mark.slow
def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("torchtitan", LLAMA31_8B, tmp_path)
    ours = resolved_model("torchtitan", "torchtitan_pretrain", derived.name, tmp_path)["model"]
    shipped = resolved_model("torchtitan", "torchtitan_pretrain", "llama3.1_8B", tmp_path)["model"]
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}
    assert ours["tie_embeddings"] is shipped.get("tie_embeddings", False) is False


@pytest.mark.slow
def test_a_family_torchtitan_lacks_is_refused_naming_it(tmp_path: Path) -> None:
    hf_config("mixtral_8x7B").save_pretrained(tmp_path)  # a whole, valid Mixtral config.json
    result = primus("checkpoint", "preset", "--hf", str(tmp_path), "--framework", "torchtitan")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model_type 'mixtral' has no TorchTitan model here" in result.stderr


@pytest.mark.slow
def test_inspect_a_dcp_checkpoint_from_a_real_run(tmp_path: Path) -> None:
    run_dir = train_run(RECIPE, tmp_path, "exp_name=ckpt", "training.steps=4",
                        "checkpoint.enable=true", "checkpoint.interval=2")  # fmt: skip
    info = inspect_json(run_dir / "checkpoint")
    assert (info["backend"], info["iteration"], info["iterations_saved"]) == (
        "torchtitan",
        4,
        [2, 4],
    )
    assert info["model"] == {"vocab_size": 512, "dim": 64, "n_layers": 2, "ffn_hidden_dim": 176,
                             "q_proj": [64, 64], "kv_proj": [32, 64], "tie_embeddings": False}  # fmt: skip
    assert info["size"]["model_parameters"] == 158016  # the same tiny model as Megatron's
    assert info["provenance"]["run_dir"] == str(run_dir.resolve())
