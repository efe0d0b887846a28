"""Building TorchTitan's Trainer.Config from Primus params (real torchtitan, in process) and the
errors bad params give (real `primus` subprocesses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from primus.backends.torchtitan.config.bridge import cli_args
from primus.backends.torchtitan.torchtitan_adapter import owned_keys
from primus.core.errors import ConfigError
from primus.core.runtime.resolution import backend_for, load
from primus.testing.fuzz_runs import assert_inputs_refused, inputs_checked
from primus.testing.runs import rejected

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"


def trainer_config(*overrides: str):
    module = next(iter(load(RECIPE, list(overrides)).modules.values()))
    adapter, _, _ = backend_for(module)  # validates the params as `train` does
    return adapter.convert_config(module)


def test_params_become_torchtitans_own_flags() -> None:
    params = {
        "training": {"steps": 20, "dtype": "float32"},
        "compile": {"enable": True, "components": ["model", "loss"]},
        "metrics": {"enable_tensorboard": False},
        "checkpoint": {"load_step": None},
        "activation_checkpoint": {"mode": "full", "preserve_rng_state": False},
        "model": {"family": "llama3"},
        "optimizer": {"lr": 1e-3},
        "device": "cpu",
    }
    assert cli_args(params, owned_keys()) == [
        "--training.steps", "20", "--training.dtype", "float32",
        "--compile.enable", "--compile.components", "model,loss",
        "--metrics.no-enable-tensorboard",
        "--checkpoint.load-step", "None",
        "activation-checkpoint:full", "--activation-checkpoint.no-preserve-rng-state",
    ]  # fmt: skip


def test_the_recipe_builds_torchtitans_config() -> None:
    from primus.backends.torchtitan.data.datasets import MockDataLoader, MockTokenizer

    config = trainer_config("training.steps=7", "optimizer.lr=0.01", "optimizer.betas=[0.8,0.9]")
    assert config.training.steps == 7 and config.training.local_batch_size == 4
    group = config.optimizer.param_groups[0]
    assert group.optimizer_kwargs["lr"] == 0.01 and group.optimizer_kwargs["betas"] == (0.8, 0.9)
    assert config.activation_checkpoint is None  # the recipe's mode: none
    assert config.model_spec.name == "llama3" and config.model_spec.flavor == "tiny"
    assert isinstance(config.dataloader, MockDataLoader.Config)
    assert isinstance(config.tokenizer, MockTokenizer.Config)
    assert config.tokenizer.vocab_size == 512
    assert config.debug.seed == 1234  # the module preset's
    full = trainer_config("activation_checkpoint.mode=full")
    assert type(full.activation_checkpoint).__qualname__ == "FullAC.Config"
    for backend, inner in (("flex", "FlexAttention"), ("sdpa", "ScaledDotProductAttention")):
        layers = trainer_config(f"model.attn_backend={backend}").model_spec.model.layers
        assert {type(layer.attention.inner_attention).__qualname__ for layer in layers} == {
            f"{inner}.Config"
        }


@pytest.mark.parametrize(
    ("preset", "family", "flavor", "rope"),
    [
        ("llama3_debug", "llama3", "debugmodel", {}),
        ("llama3.2_1B", "llama3", "1B", {"scaling_factor": 32.0}),  # HF's; TorchTitan keeps 8
        ("llama3.1_8B", "llama3", "8B", {}),
        ("qwen3_0.6B", "qwen3", "0.6B", {}),
        ("qwen3_8B", "qwen3", "8B", {}),
    ],
)
def test_presets_equal_torchtitans_own_flavors(
    preset: str, family: str, flavor: str, rope: dict
) -> None:
    import importlib

    from torchtitan.models.common.rope import RoPE

    config = trainer_config(f"modules.pre_trainer.model={preset}")
    upstream = importlib.import_module(f"torchtitan.models.{family}").model_registry(flavor)
    assert config.model_spec.flavor == preset
    for _, rope_config, *_ in upstream.traverse(RoPE.Config, recurse=True):
        for key, value in rope.items():
            setattr(rope_config, key, value)

    def shape(model: object) -> str:  # the whole config tree; init closures by name
        return re.sub(r" at 0x[0-9a-f]+", "", repr(model.to_dict()))  # type: ignore[attr-defined]

    assert shape(config.model_spec.model) == shape(upstream.model)


def validate(tmp_path: Path, *lines: str, train: bool = False) -> str:
    return rejected(RECIPE, tmp_path, *lines, train=train)


@pytest.mark.slow
def test_unknown_and_mistyped_keys_name_file_line_and_the_closest_keys(tmp_path: Path) -> None:
    err = validate(
        tmp_path,
        "training:",
        "  step: 5",
        "  local_batch_size: four",
        "  max_norm: null",
        "model:",
        "  family: gpt2",
    )
    assert "exp.yaml:6: unknown parameter 'training.step' (did you mean: training.steps" in err
    assert "exp.yaml:7: training.local_batch_size: must be an integer, got str 'four'" in err
    assert "exp.yaml:8: training.max_norm: cannot be null (default: 1.0)" in err  # typed float
    assert "exp.yaml:10: model.family: must be one of 'llama3', 'qwen3'" in err


@pytest.mark.slow
def test_torchtitans_own_rejections_are_config_errors_at_the_key(tmp_path: Path) -> None:
    err = validate(tmp_path, "training:", "  dtype: float33", train=True)  # the schema's choices
    assert "exp.yaml:6: training.dtype: must be one of 'bfloat16', 'float32', got 'float33'" in err
    err = validate(
        tmp_path,
        "parallelism: {pipeline_parallel_degree: 2, pipeline_parallel_microbatch_size: 3}",
        train=True,
    )
    assert "TorchTitan rejected the config" in err and "evenly divisible" in err


@pytest.mark.slow
def test_a_model_section_without_dimensions_says_what_is_missing(tmp_path: Path) -> None:
    err = validate(tmp_path, "model: {dim: null, n_layers: null}", train=True)
    assert "missing model.dim, model.n_layers" in err and "model preset" in err


def test_float8_without_torchao_is_a_config_error_not_torchtitans_import_error() -> None:
    """The workspace does not install torchao (float8's own dependency)."""
    with pytest.raises(ConfigError, match=r"model\.float8 needs torchao") as raised:
        trainer_config("model.float8=true")
    assert "pip install torchao" in str(raised.value.hint)


def test_the_optimizer_names_are_torchtitans() -> None:
    import inspect

    from torchtitan.components.optimizer import OptimizersContainer

    from primus.backends.torchtitan.config.bridge import OPTIMIZERS

    source = inspect.getsource(OptimizersContainer._resolve_optimizer_factory)
    assert set(re.findall(r'"(\w+)":', source)) == set(OPTIMIZERS)
    with pytest.raises(ConfigError, match=r"optimizer\.name: must be one of 'Adam', 'AdamW'"):
        trainer_config("optimizer.name=Adamw")


def test_an_initial_load_path_torchtitan_would_not_read_is_refused(tmp_path: Path) -> None:
    hf, step = tmp_path / "hf", tmp_path / "ckpt" / "step-10"
    for folder in (hf, step):
        folder.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"x")
    (step / ".metadata").write_bytes(b"x")
    at, on = "checkpoint.initial_load_path=", "checkpoint.enable=true"
    assert_inputs_refused(RECIPE, [
        ((f"{at}{hf}",), "read only with checkpoint.enable: true", "set checkpoint.enable: true"),
        ((f"{at}rel/step-5", on), "takes an absolute path, not 'rel/step-5'", "/rel/step-5"),
        ((f"{at}{tmp_path}/none", on), "none does not exist", "step-N folder"),
        ((f"{at}{hf}/config.json", on), "config.json is not a folder", "step-N folder"),
        ((f"{at}{hf}", on), "holds an HF model, not a DCP checkpoint", "init_from: {hf: DIR}"),
        ((f"{at}{tmp_path}", on), "holds no DCP checkpoint", "step-N folder"),
        ((f"{at}{step.parent}", on), "holds no DCP checkpoint", f"e.g. {step} (the latest)"),
        ((f"{at}{step}", on, "checkpoint.initial_load_in_hf=true"), "holds no *.safetensors",
         "initial_load_in_hf: false"),
    ])  # fmt: skip
    inputs_checked(RECIPE, f"{at}{step}", on)
    inputs_checked(RECIPE, f"{at}{hf}", on, "checkpoint.initial_load_in_hf=true")


def test_sft_rows_torchtitan_cannot_train_as_asked_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchTitan's loss splits each row (each sequence-parallel shard of it) into 8 chunks:
    another sft.seq_length was a RuntimeError traceback at step 1. SDPA's causal attention over
    a packed row would let its samples attend to each other."""
    import json

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "head_dim": 16,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 256, "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192},
    }))  # fmt: skip
    (hf / "model.safetensors").write_bytes(b"x")
    monkeypatch.setenv("PRIMUS_SFT_HF", str(hf))
    recipe = RECIPE.with_name("sft-tiny-cpu.yaml")

    def check(*overrides: str) -> None:
        backend_for(next(iter(load(recipe, list(overrides)).modules.values())), stage="posttrain")

    with pytest.raises(ConfigError, match=r"sft\.seq_length 14 is not a multiple of 8") as raised:
        check("sft.seq_length=14")
    assert "e.g. 16" in str(raised.value.hint)
    tp = ("parallelism.tensor_parallel_degree=2", "parallelism.enable_sequence_parallel=true")
    with pytest.raises(ConfigError, match=r"sft\.seq_length 24 is not a multiple of 16"):
        check("sft.seq_length=24", *tp)
    check("sft.seq_length=32", *tp)
    with pytest.raises(ConfigError, match=r"packed samples \(sft\.packing: true\) would attend"):
        check("sft.packing=true", "model.attn_backend=sdpa")
    check("sft.packing=false", "model.attn_backend=sdpa")
