"""MaxText's config from Primus params (real maxtext: pyconfig in process) and the errors bad
params give (real `primus` processes; those that import MaxText forked by conftest's `forks`)."""

from __future__ import annotations

import operator
import re
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from primus.backends.maxtext.config.bridge import base_config, maxtext_argv
from primus.backends.maxtext.config.mesh import mesh_origin
from primus.backends.maxtext.config.rules import BOUNDS, MESH_AXIS, RULES, mesh_rules
from primus.backends.maxtext.maxtext_adapter import MaxTextAdapter
from primus.core.config import ParamSchema, ParamSpec
from primus.core.config.loader import load_config_file
from primus.core.errors import ConfigError
from primus.core.runtime.resolution import backend_for, load
from primus.testing import runs
from primus.testing.faults import Forks
from primus.testing.forked import forked
from primus.testing.fuzz_runs import assert_inputs_refused, inputs_checked
from primus.testing.runs import rejected

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "maxtext"
RECIPE = RECIPES / "tiny-cpu.yaml"
PRESETS = Path(__file__).resolve().parents[1] / "src/primus/backends/maxtext/configs/models"


def test_params_become_maxtexts_command_line() -> None:
    params = {
        "steps": 20,
        "learning_rate": 3e-3,
        "mlp_activations": ["silu", "linear"],
        "run_name": "1234",
        "enable_dropout": False,
        "tokenizer_path": "",
        "dpo": {"beta": 0.1},
        "peak_tflops": 989.0,
    }
    argv = maxtext_argv(params, ParamSchema({"peak_tflops": ParamSpec(float)}))
    assert argv[:2] == ["", base_config()] and Path(argv[1]).is_file()
    assert argv[2:] == [
        "steps=20",
        "learning_rate=0.003",
        "mlp_activations=[silu, linear]",
        "run_name='1234'",
        "enable_dropout=false",
        "tokenizer_path=''",
        "dpo={beta: 0.1}",
    ]
    # MaxText's own parser (OmegaConf's command line) reads back the very same values
    del params["peak_tflops"]
    assert OmegaConf.to_container(OmegaConf.from_cli(argv[2:])) == params


def test_the_schema_is_maxtexts_config_model() -> None:
    from maxtext.configs.types import MaxTextConfig

    from primus.backends.maxtext.config.bridge import maxtext_schema

    specs = maxtext_schema().specs
    assert set(specs) == set(MaxTextConfig.model_fields)
    assert specs["steps"].type is int and specs["learning_rate"].type is float
    assert specs["per_device_batch_size"].type == (int, float)
    assert specs["hardware"].choices == ("tpu", "gpu", "gpu_multiprocess", "cpu")
    assert "bfloat16" in specs["dtype"].choices and specs["dtype"].type is str
    assert specs["mlp_activations"].type is list and specs["dpo"].type is dict
    assert specs["logical_axis_rules"].type is None  # any: pydantic checks it
    assert specs["base_emb_dim"].help and specs["base_emb_dim"].default == 2048


BOUND_TESTS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def test_the_fast_check_refuses_what_maxtexts_config_bounds_refuse() -> None:
    """Each bound of MaxTextConfig (pydantic's ge, gt, le, lt) is a rule checked without
    MaxText: at and around each bound, the rule refuses what pydantic refuses, and BOUNDS
    (no stricter than MaxText) takes what it takes."""
    from maxtext.configs.types import MaxTextConfig

    for name, field in MaxTextConfig.model_fields.items():
        bounds = [(getattr(m, k), t) for m in field.metadata for k, t in BOUND_TESTS.items()
                  if isinstance(getattr(m, k, None), int | float)]  # fmt: skip
        if not bounds:
            assert name not in BOUNDS, f"{name}: MaxText has no bound on it"
            continue
        assert name in RULES, f"{name}: MaxText bounds it, no rule checks it"
        integer = int in (typing.get_args(field.annotation) or (field.annotation,))
        steps = (-1, 0, 1) if integer else (-1, -0.5, 0, 0.5, 1)
        for value in (end + step for end, _ in bounds for step in steps):
            legal = all(test(value, end) for end, test in bounds)
            refused = RULES[name].problem(name, value) is not None
            assert refused or legal, f"{name}={value}: MaxText refuses it, the fast check not"
            assert not (refused and legal and name in BOUNDS), f"{name}={value}: MaxText takes it"


def test_every_mesh_axis_is_a_size_or_minus_one() -> None:
    rules = mesh_rules(MaxTextAdapter("maxtext").param_schema())
    axes = {
        key for key in _yaml(Path(base_config())) if re.fullmatch(r"(ici|dcn)_\w+_parallelism", key)
    }
    assert set(rules) == axes and set(rules.values()) == {MESH_AXIS}
    assert [MESH_AXIS.problem("k", v) is None for v in (-2, -1, 0, 1, 8)] == [0, 1, 0, 1, 1]


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("preset", "upstream", "added"),
    [
        # MaxText picks its Llama-3 RoPE from a model_name of llama3.1-*, which presets do not set
        ("llama3.1_8B", "llama3.1-8b", {"rope_type": "llama3.1"}),
        # HF's router_aux_loss_coef: MaxText's file leaves the load-balancing loss off
        ("mixtral_8x7B", "mixtral-8x7b", {"load_balance_loss_weight": 0.02}),
    ],
)
def test_presets_equal_maxtexts_own_model_configs(preset: str, upstream: str, added: dict) -> None:
    models = Path(base_config()).parent / "models"
    expected = _yaml(models / f"{upstream}.yml") | added
    assert load_config_file(PRESETS / f"{preset}.yaml").data == expected


def test_the_1b_preset_has_the_8b_presets_keys() -> None:
    small, large = _yaml(PRESETS / "llama3.2_1B.yaml"), _yaml(PRESETS / "llama3.1_8B.yaml")
    # Llama 3.2's RoPE factor 32; tied logits that HF does not divide by sqrt(emb_dim)
    assert small.keys() - {"rope_scaling_factor", "normalize_embedding_logits"} == large.keys()
    assert (small["base_emb_dim"], small["head_dim"], small["logits_via_embedding"]) == (
        2048,
        64,
        True,
    )


@pytest.fixture(scope="module")
def convert():
    """The adapter's convert_config on the tiny recipe plus overrides, in this process."""
    from primus.backends.maxtext.config.errors import config_errors
    from primus.core.patches import PatchContext, restore_all

    ctx = PatchContext("maxtext", "setup", None, "0", {})
    with ctx.running("maxtext.config_errors"):  # as in a run: pyconfig raises, never exits
        config_errors(ctx)

    def build(*overrides: str):
        module = next(iter(load(RECIPE, list(overrides)).modules.values()))
        adapter, _, _ = backend_for(module)  # validates the params as `train` does
        return adapter.convert_config(module)

    yield build
    restore_all("maxtext.config_errors")


def test_the_recipe_builds_maxtexts_config(convert) -> None:
    args = convert("steps=7", "base_emb_dim=32")
    assert "hardware=cpu" in args.argv and "steps=7" in args.argv
    config = args.config
    assert (config["steps"], config["base_emb_dim"], config["base_num_decoder_layers"]) == (
        7,
        32,
        2,
    )
    assert (config["dtype"], config["decoder_block"], config["vocab_size"]) == (
        "float32",
        "llama2",
        256,
    )
    assert config["emb_dim"] == 32  # derived by MaxText from base_emb_dim


def test_the_trainers_mesh_error_is_at_the_layout_key_set(convert) -> None:
    """MaxText builds its mesh once JAX has started (a GPU's, a multi-slice one): its error
    names where the layout was set."""
    args = convert("num_slices=2", "per_device_batch_size=2")
    assert set(args.origins) == {"num_slices", "per_device_batch_size"}
    assert str(mesh_origin(args.origins, args.config)) == "cli (num_slices=2)"
    plain = convert()
    assert mesh_origin(plain.origins, plain.config) is None


def test_pydantic_rejections_are_config_errors_at_the_key(convert) -> None:
    with pytest.raises(ConfigError) as caught:
        convert("train_data_columns=[1]")  # a list is checked before, not its items
    error = caught.value
    assert str(error.origin) == "cli (train_data_columns=[1])"
    assert "MaxText rejected the config: train_data_columns: " in error.message
    assert "Input should be a valid string (got 1)" in error.message


def test_a_null_maxtexts_type_admits_not_is_refused_at_the_key(convert) -> None:
    with pytest.raises(ConfigError) as caught:
        convert("hidden_size_per_layer_input=null")  # typed int: pydantic would reject it
    assert str(caught.value.origin) == "cli (hidden_size_per_layer_input=null)"
    assert caught.value.message == "hidden_size_per_layer_input: cannot be null (default: 0)"
    convert("tokenizer_path=null")  # typed None | str: taken


def validate(tmp_path: Path, *lines: str, train: bool = False) -> str:
    return rejected(RECIPE, tmp_path, *lines, train=train)


@pytest.mark.slow
def test_unknown_and_mistyped_keys_name_file_line_and_the_closest_keys(tmp_path: Path) -> None:
    err = validate(tmp_path, "base_emb_dimm: 64", "steps: twenty", "hardware: cpuu")
    assert "exp.yaml:5: unknown parameter 'base_emb_dimm' (did you mean: base_emb_dim" in err
    assert "exp.yaml:6: steps: must be an integer, got str 'twenty'" in err
    assert "exp.yaml:7: hardware: must be one of 'tpu', 'gpu', 'gpu_multiprocess', 'cpu'" in err


@pytest.mark.slow
def test_maxtexts_own_rejections_are_config_errors_at_the_key(tmp_path: Path, forks: Forks) -> None:
    with forked(forks, runs):
        err = validate(tmp_path, "rope_interleave: false", "rope_pairwise: true", train=True)
    assert "exp.yaml:6: MaxText rejected the config:" in err
    assert "rope_pairwise=True requires rope_interleave=True" in err
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(("overrides", "where"), [
    (("dump_hlo=true",), "{run_dir}/hlo_dump"),
    (("dump_hlo=true", "dump_hlo_local_dir=/scratch/hlo"), "/scratch/hlo"),
])  # fmt: skip
def test_an_hlo_dump_goes_into_the_run_directory_unless_placed(
    tmp_path: Path, overrides: tuple[str, ...], where: str, forks: Forks
) -> None:
    """MaxText's default, /tmp/xla_dump/, would be shared by every run on the machine."""
    result = forks.run(
        ["train", "pretrain", "--config", str(RECIPE), "--dry-run", "--full", *overrides],
        {"PRIMUS_WORKSPACE": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "local" / "local" / "maxtext-tiny"
    assert f"dump_hlo_local_dir={where.format(run_dir=run_dir)}" in result.stdout


def test_an_hlo_dump_stays_in_the_run_directory_without_a_gcs_folder(tmp_path: Path) -> None:
    """MaxText uploads the dump after the first step and, with no gs:// folder, the upload
    (no credentials) ended the run: patch maxtext.hlo_dump_kept keeps it local."""
    from maxtext.utils import gcs_utils

    from primus.backends.maxtext.observability.run_dir import _hlo_dump_not_for_gcs, hlo_dump_kept
    from primus.core.patches import PatchContext, restore_all

    dump = tmp_path / "hlo_dump"
    dump.mkdir()
    (dump / "module.txt").write_text("HloModule")
    params = {"dump_hlo": True, "dump_hlo_local_dir": str(dump), "base_output_directory": "/o"}
    ctx = PatchContext("maxtext", "before_train", None, "0", params)
    assert _hlo_dump_not_for_gcs(ctx)
    assert not _hlo_dump_not_for_gcs(PatchContext("maxtext", "before_train", None, "0",
                                                  params | {"dump_hlo_gcs_dir": "gs://b/d"}))  # fmt: skip
    try:
        with ctx.running("maxtext.hlo_dump_kept"):
            hlo_dump_kept(ctx)
        gcs_utils.upload_dump(str(dump), "/o/run/xla_dump", delete_local_after=True)
    finally:
        restore_all("maxtext.hlo_dump_kept")
    assert (dump / "module.txt").read_text() == "HloModule"  # not deleted, no upload tried


def test_the_remat_policies_are_those_maxtexts_decoder_takes() -> None:
    import inspect

    from maxtext.layers.nnx_decoders import NNXDecoder

    from primus.backends.maxtext.config.bridge import REMAT_POLICIES, maxtext_schema

    source = inspect.getsource(NNXDecoder.get_remat_policy)
    named = re.findall(r'remat_policy [!=]= "(\w+)"', source)
    named += re.findall(r'"(\w+)"', "".join(re.findall(r"remat_policy in \{[^}]*\}", source)))
    assert set(named) == set(REMAT_POLICIES)
    assert maxtext_schema().specs["remat_policy"].choices == REMAT_POLICIES


def test_a_load_path_that_is_no_orbax_checkpoint_is_refused(tmp_path: Path) -> None:
    hf, steps = tmp_path / "hf", tmp_path / "checkpoints"
    (steps / "7" / "items").mkdir(parents=True)
    (steps / "7" / "_CHECKPOINT_METADATA").write_text("{}")
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"x")
    assert_inputs_refused(RECIPE, [
        ((f"load_parameters_path={tmp_path}/none",), "none does not exist", "CHECKPOINTS/N"),
        ((f"load_full_state_path={hf}/config.json",), "config.json is not a folder", "items"),
        ((f"load_parameters_path={hf}",), "holds an HF model, not an orbax checkpoint",
         "init_from"),
        ((f"load_full_state_path={steps}",), "holds no orbax checkpoint", f"e.g. {steps / '7'}"),
        (("remat_policy=ful",), "remat_policy: must be one of 'none', 'full'", ""),
        (("learning_rate_final_fraction=-0.1",), "learning_rate_final_fraction must be a number",
         ""),
    ])  # fmt: skip
    inputs_checked(RECIPE, f"load_parameters_path={steps / '7'}")
    inputs_checked(RECIPE, "load_parameters_path=gs://bucket/checkpoints/7/items")
