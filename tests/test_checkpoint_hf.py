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
        ({"model_type": None}, "'model_type' is missing"),
        ({"model_type": ["llama"]}, "'model_type' must be a string, not an array"),
        ({"rope_scaling": "llama3"}, "'rope_scaling' must be an object, not a string"),
        ({"tie_word_embeddings": "no"}, "'tie_word_embeddings' must be true or false, not a str"),
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


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({}, "'model_type' is missing"),
        ({"model_type": 3}, "'model_type' must be a string, not a number (3)"),
        ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": "big"},
         "'hidden_size' must be a positive integer, not 'big'"),
    ],
)  # fmt: skip
def test_preset_of_a_config_json_with_a_bad_field_is_exit_2_naming_it(
    tmp_path: Path, config: dict, said: str
) -> None:
    """In process: `{}` said "model_type 'None' is not supported"."""
    import json

    from primus.testing.fuzz_runs import run_in_process

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    argv = ["checkpoint", "preset", "--hf", "hf", "--framework", "megatron"]
    done = run_in_process(argv, tmp_path, {})
    assert (done.code, done.stderr.splitlines()[0]) == (2, f"error: hf/config.json: {said}")


def test_preset_header_keeps_odd_names_in_its_comments(tmp_path: Path) -> None:
    """architectures of numbers was a TypeError; a newline in _name_or_path began a YAML line."""
    import json

    import yaml

    from primus.core.checkpoint.preset import derive_preset

    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
              "rms_norm_eps": 1e-5, "rope_theta": 1e4, "max_position_embeddings": 128,
              "architectures": [1, "A"], "_name_or_path": "x\nvocab_size: 3"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = derive_preset(tmp_path, "megatron")
    assert "architectures 1, A)" in text and "config.json of x vocab_size: 3\n" in text
    assert yaml.safe_load(text)["vocab_size"] == 100


def test_a_config_json_named_instead_of_its_folder_is_told(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"config\.json: a file, not a Hugging Face model dir"):
        read_config(tmp_path / "config.json")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "Expecting property name"),
        ("[1]", "array, not an object"),
        ('{"initial_weights": "hf"}', "its initial_weights name no HF folder"),
    ],
)
def test_a_damaged_provenance_record_is_named(
    hf_dir: tuple[Path, int], tmp_path: Path, text: str, why: str
) -> None:
    """It was a JSONDecodeError's or a TypeError's traceback."""
    import shutil

    from primus.core.checkpoint.provenance import PROVENANCE_FILE

    folder = Path(shutil.copytree(hf_dir[0], tmp_path / "hf"))
    (folder / PROVENANCE_FILE).write_text(text)
    with pytest.raises(ConfigError, match=f"{PROVENANCE_FILE}: not a provenance record") as err:
        inspect_checkpoint(folder)
    assert why in err.value.message and "restore it or remove it" in str(err.value.hint)
