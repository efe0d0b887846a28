"""`primus checkpoint inspect` on a Hugging Face directory written by transformers, read from
the safetensors headers; and the errors for what it cannot read."""

from pathlib import Path

import pytest

from primus.core.checkpoint.hf import HFArchitecture, read_config
from primus.core.checkpoint.inspect import inspect_checkpoint
from primus.core.errors import ConfigError
from primus.testing.runs import primus


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny random LlamaForCausalLM saved by transformers: (folder, its parameter count)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         tie_word_embeddings=True, max_position_embeddings=256)  # fmt: skip
    folder = tmp_path_factory.mktemp("hf")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder, model.num_parameters()


def test_inspect_reads_shape_and_tensors_from_the_headers(hf_dir: tuple[Path, int]) -> None:
    folder, parameters = hf_dir
    info = inspect_checkpoint(folder)
    assert (info["format"], info["backend"], info["iteration"]) == ("huggingface", None, None)
    assert info["model"]["architectures"] == ["LlamaForCausalLM"]
    assert info["model"]["hidden_size"] == 64 and info["model"]["num_hidden_layers"] == 2
    size = info["size"]
    assert size["parameters"] == parameters  # tied: the embedding is stored once
    assert size["dtypes"] == {"BF16": size["tensors"]}
    assert size["tensor_bytes"] == 2 * parameters
    assert size["bytes"] == (folder / "model.safetensors").stat().st_size
    assert info["provenance"] is None


def test_the_saved_config_parses_to_its_architecture(hf_dir: tuple[Path, int]) -> None:
    arch = HFArchitecture.from_config(read_config(hf_dir[0]))
    assert (arch.family, arch.hidden_size, arch.num_kv_heads, arch.head_dim) == (
        "llama3",
        64,
        2,
        16,
    )
    assert arch.tie_embeddings and arch.rope_scaling is None and arch.num_experts is None


def test_a_truncated_safetensors_file_is_named(hf_dir: tuple[Path, int], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((hf_dir[0] / "config.json").read_bytes())
    data = (hf_dir[0] / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"model.safetensors: truncated safetensors file"):
        inspect_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"hidden_act": "gelu"}, "'hidden_act: \"gelu\"' is not supported"),
        ({"sliding_window": 4096}, "'sliding_window: 4096' is not supported"),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            "'rope_parameters.rope_type: yarn'",
        ),
        ({"rms_norm_eps": None}, "'rms_norm_eps' is missing"),
        ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer, not 0"),
        ({"hidden_size": -64}, "'hidden_size' must be a positive integer, not -64"),
        ({"num_key_value_heads": "2"}, "'num_key_value_heads' must be a positive integer, not '2'"),
        ({"num_key_value_heads": 3}, "'num_key_value_heads: 3' does not divide"),
        ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' must be a finite number above 0, not nan"),
        ({"rms_norm_eps": "1e-5"}, "'rms_norm_eps' must be a finite number above 0, not '1e-5'"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": float("inf")}},
            "'rope_theta' must be a finite number above 0, not inf",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 5e5,
                    "factor": -3.0,
                    "low_freq_factor": 1,
                    "high_freq_factor": 4,
                    "original_max_position_embeddings": 8192,
                }
            },
            "'rope_parameters.factor' must be a finite number above 0, not -3.0",
        ),
    ],
)
def test_unsupported_fields_are_named(hf_dir: tuple[Path, int], change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        HFArchitecture.from_config(read_config(hf_dir[0]) | change)


def test_a_bad_field_of_the_hf_config_names_its_file(
    hf_dir: tuple[Path, int], tmp_path: Path
) -> None:
    """Through a backend's preset (megatron's, read without importing Megatron)."""
    import json

    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.checkpoint.preset import preset_from_hf

    config = read_config(hf_dir[0]) | {"hidden_size": -3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    adapter = BackendRegistry.get_adapter("megatron")
    message = f"{tmp_path / 'config.json'}: 'hidden_size' must be a positive integer, not -3"
    with pytest.raises(ConfigError) as err:
        preset_from_hf(adapter, tmp_path, config)
    assert err.value.message == message


@pytest.mark.slow
def test_a_path_nothing_recognises_is_exit_2_saying_what_was_looked_for(tmp_path: Path) -> None:
    result = primus("checkpoint", "inspect", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not a checkpoint Primus recognises" in result.stderr
    assert "looked for a Hugging Face directory (config.json + *.safetensors)" in result.stderr
