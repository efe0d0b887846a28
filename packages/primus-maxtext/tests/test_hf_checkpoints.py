"""HF checkpoints into and out of MaxText, on tiny random HF models of each family: MaxText's
forward on the import equals transformers' logits, the export loads in transformers with the
same logits and is the source again (bit-exact per tensor, in its dtype; its config.json,
generation_config.json and tokenizer, unless the experiment names its own), and bad input is
refused.

Import and export run in this process (PrimusRuntime, as `primus checkpoint` does) so JAX and
MaxText load once; one CLI run checks the exit status and that nothing is left half-written
(forked by conftest's `forks`), another that the import command runs without torch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from primus.backends.maxtext.checkpoint import hf, hf_mapping
from primus.core.checkpoint import hf_tensors
from primus.core.checkpoint.hf import read_config
from primus.core.errors import ConfigError
from primus.testing.faults import Forks
from primus.testing.hf_models import hf_logits, make_hf_model
from primus.testing.runs import primus_imports

pytestmark = pytest.mark.slow
TOKENS = np.random.default_rng(0).integers(0, 256, (2, 24))
OVERRIDES = {
    "hardware": "cpu", "dataset_type": "synthetic", "packing": False, "steps": 2,
    "per_device_batch_size": 2, "max_target_length": 32, "dtype": "float32",
    "matmul_precision": "highest",
}  # fmt: skip
CASES = {  # name -> (family, config.json changes)
    "llama3": ("llama3", {}),
    "llama3-tied": ("llama3", {"tie_word_embeddings": True}),
    "qwen2.5": ("qwen2.5", {}),
    "qwen3": ("qwen3", {}),
    "mixtral": ("mixtral", {}),
}  # llama3 with default RoPE: test_checkpoints.py's init_from run


def experiment(folder: Path, hf: Path, tokenizer: Path | None = None,
               extra: dict[str, Any] | None = None, **changes: Any) -> Path:  # fmt: skip
    """A one-module MaxText experiment whose model preset is derived from `hf`'s config
    (with `changes`), with OVERRIDES and `extra`."""
    from primus.backends.maxtext.checkpoint.native import preset_from_hf

    (folder / "preset.yaml").write_text(yaml.safe_dump(preset_from_hf(read_config(hf)) | changes))
    overrides = (
        OVERRIDES | ({"tokenizer_path": str(tokenizer)} if tokenizer else {}) | (extra or {})
    )
    module = {"framework": "maxtext", "config": "maxtext_pretrain", "model": "preset.yaml",
              "overrides": overrides}  # fmt: skip
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({"workspace": str(folder / "ws"), "exp_name": "hf",
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    return exp


@contextmanager
def runtime(exp: Path) -> Iterator[Any]:
    """PrimusRuntime for `exp`; the environment and what its patches replaced are put back
    after."""
    from primus.core.patches import rebind
    from primus.core.runtime.primus_runtime import PrimusRuntime

    saved = dict(os.environ)
    try:
        yield PrimusRuntime(exp)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        rebind.restore_all()


def maxtext_logits(run: Any) -> np.ndarray:
    """MaxText's fp32 forward (the model its trainer builds) on TOKENS, from the checkpoint
    the run starts from (its import)."""
    import jax

    config = hf_mapping.maxtext_config(run.backend_args().argv)
    model, params, treedef = hf_mapping.abstract_model(config)
    start = Path(config.load_parameters_path).parent
    loaded = hf.load_params(config, params, start)
    tree = jax.tree_util.tree_unflatten(treedef, [loaded[key] for key in params])
    positions = np.broadcast_to(np.arange(TOKENS.shape[1]), TOKENS.shape)
    logits = model.apply(tree, TOKENS, positions, decoder_segment_ids=np.ones_like(TOKENS),
                         enable_dropout=False)  # fmt: skip
    return np.asarray(logits)


@dataclass
class Converted:
    family: str
    hf: Path
    exp: Path
    imported: Path
    exported: Path
    logits: np.ndarray  # MaxText's, on the import


@pytest.fixture(scope="module", params=list(CASES))
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Converted:
    family, changes = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_hf_model(folder / "hf", family, **changes)
    hf_tokenizer(hf, "source")
    # the experiment's own tokenizer for one case; the others export the source's
    tokenizer = hf_tokenizer(folder / "tokenizer") if request.param == "llama3" else None
    exp = experiment(folder, hf, tokenizer)
    with runtime(exp) as run, pytest.MonkeyPatch.context() as patch:
        imported = run.import_hf(hf)  # one runtime: its patches (RoPE factor) stay applied
        logits = maxtext_logits(run)
        if family == "mixtral":  # an export in several shards, with its index
            patch.setattr(hf_tensors, "SHARD_BYTES", 100_000)
        exported = run.export_hf(None, folder / "export")
    return Converted(family, hf, exp, imported, exported, logits)


def hf_tokenizer(folder: Path, unknown: str = "[UNK]") -> Path:
    """An HF tokenizer folder (a word-level tokenizer.json is enough here), whose unknown
    token tells it apart."""
    from tokenizers import Tokenizer, models

    folder.mkdir(exist_ok=True)
    Tokenizer(models.WordLevel({unknown: 0}, unk_token=unknown)).save(
        str(folder / "tokenizer.json")
    )
    return folder


def tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v for f in folder.glob("*.safetensors") for k, v in load_file(f).items()}


def test_import_gives_transformers_logits(converted: Converted) -> None:
    assert (converted.imported / "0" / "items").is_dir()
    assert (converted.imported / "primus_provenance.json").is_file()
    reference = hf_logits(converted.hf, TOKENS).numpy()
    assert np.abs(converted.logits - reference).max() <= 1e-4


def test_export_loads_in_transformers_with_the_same_logits(converted: Converted) -> None:
    own = converted.hf.parent / "tokenizer"  # the experiment's; else the source's
    tokenizer = (own if own.is_dir() else converted.hf) / "tokenizer.json"
    assert (converted.exported / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    generation = "generation_config.json"
    assert (converted.exported / generation).read_bytes() == (
        converted.hf / generation
    ).read_bytes()
    index = converted.exported / "model.safetensors.index.json"
    assert index.is_file() == (converted.family == "mixtral")
    source, exported = tensors(converted.hf), tensors(converted.exported)
    assert sorted(exported) == sorted(source)
    for name, tensor in source.items():  # the round trip is bit-exact per tensor
        assert exported[name].dtype == tensor.dtype and np.array_equal(exported[name], tensor), name
    assert np.array_equal(hf_logits(converted.exported, TOKENS), hf_logits(converted.hf, TOKENS))
    # the source's config.json: max_position_embeddings (MaxText keeps no such number), RoPE
    # scaling and all
    assert read_config(converted.exported) == read_config(converted.hf)


def test_an_import_without_its_query_record_keeps_maxtexts_folding(tmp_path: Path) -> None:
    """An import folder without `query_scale.json` (an earlier Primus's) holds query weights
    with the scale folded in: the model applies none at run time, and the export multiplies
    them by sqrt(head_dim). So the export is the model MaxText runs, and its queries are the
    folder's times sqrt(head_dim)."""
    from primus.backends.maxtext.checkpoint.query_record import RECORD

    hf = make_hf_model(tmp_path / "hf", "llama3", head_dim=32)
    exp = experiment(tmp_path, hf)
    with runtime(exp) as run:
        imported = run.import_hf(hf)
        assert (imported / RECORD).is_file()
        (imported / RECORD).unlink()
        logits = maxtext_logits(run)
        exported = run.export_hf(None, tmp_path / "export")
    assert np.abs(logits - hf_logits(exported, TOKENS).numpy()).max() <= 1e-4
    source, again = tensors(hf), tensors(exported)
    for name, tensor in source.items():
        scale = np.sqrt(32) if name.endswith("q_proj.weight") else 1.0
        np.testing.assert_allclose(again[name], tensor * scale, rtol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An HF llama3 model and an experiment of its architecture: (hf, exp)."""
    folder = tmp_path_factory.mktemp("bad")
    hf = make_hf_model(folder / "hf", "llama3")
    return hf, experiment(folder, hf)


def test_the_import_command_runs_without_torch(llama: tuple[Path, Path], tmp_path: Path) -> None:
    """`primus checkpoint import` hides torch (MaxText imports it only on the way, slowly)."""
    hf, _ = llama
    exp = experiment(tmp_path, hf)
    result, imported = primus_imports("checkpoint", "import", "--hf", str(hf), "--config", str(exp))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "maxtext" in imported and "torch" not in imported, imported
    assert "PyTorch was not found" not in result.stderr  # transformers' notice: dropped
    assert [p.name for p in leftovers(exp)] == ["hf_import"]


def broken(hf: Path, folder: Path, change: Any) -> Path:
    """A copy of `hf` whose tensors `change` (a function of the tensor dict) rewrote."""
    from safetensors.numpy import save_file

    shutil.copytree(hf, folder)
    save_file(change(tensors(hf)), str(folder / "model.safetensors"))
    return folder


def leftovers(exp: Path) -> list[Path]:
    """Import folders (staged or final) under the experiment's workspace."""
    return list((exp.parent / "ws").rglob("*hf_import*"))


def refused(exp: Path, hf: Path) -> str:
    """The ConfigError importing `hf` raises; nothing is left behind."""
    with runtime(exp) as run, pytest.raises(ConfigError) as error:
        run.import_hf(hf)
    assert not leftovers(exp)
    return str(error.value)


def test_a_missing_tensor_is_named(llama: tuple[Path, Path], tmp_path: Path) -> None:
    hf, exp = llama
    name = "model.layers.1.mlp.up_proj.weight"
    bad = broken(hf, tmp_path / "hf", lambda t: {k: v for k, v in t.items() if k != name})
    assert f"tensor '{name}' is missing" in refused(exp, bad)


def test_a_tensor_the_model_has_no_place_for_is_named(
    llama: tuple[Path, Path], tmp_path: Path
) -> None:
    hf, exp = llama
    name = "model.layers.0.mlp.up_proj.weight"
    bad = broken(hf, tmp_path / "hf", lambda t: t | {"model.layers.2.mlp.up_proj.weight": t[name]})
    assert "tensor 'model.layers.2.mlp.up_proj.weight' has no place" in refused(exp, bad)


def test_an_integer_tensor_is_named(llama: tuple[Path, Path], tmp_path: Path) -> None:
    hf, exp = llama
    name = "model.layers.0.self_attn.k_proj.weight"
    bad = broken(hf, tmp_path / "hf", lambda t: t | {name: t[name].astype(np.int64)})
    message = refused(exp, bad)
    assert f"model.safetensors: tensor '{name}' has dtype I64; expected a floating-point" in message


def test_a_mismatched_architecture_is_refused(llama: tuple[Path, Path], tmp_path: Path) -> None:
    hf, _ = llama
    exp = experiment(tmp_path, hf, base_mlp_dim=96)
    assert "base_mlp_dim: 128 in the HF config, 96 in the experiment" in refused(exp, hf)


def test_a_truncated_file_exits_2_naming_it(
    llama: tuple[Path, Path], tmp_path: Path, forks: Forks
) -> None:
    hf, exp = llama
    bad = tmp_path / "hf"
    shutil.copytree(hf, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    result = forks.run(["checkpoint", "import", "--hf", str(bad), "--config", str(exp)], {})
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{bad}/model.safetensors: truncated safetensors file: tensor '" in result.stderr
    assert "Traceback" not in result.stderr
    assert not leftovers(exp)


def test_an_unsupported_family_is_a_config_error(llama: tuple[Path, Path], tmp_path: Path) -> None:
    hf, _ = llama
    exp = experiment(tmp_path, hf, decoder_block="gemma")
    with runtime(exp) as run, pytest.raises(ConfigError, match="decoder_block 'gemma' has no HF"):
        run.export_hf(None, tmp_path / "out")


def test_a_bfloat16_checkpoint_is_imported_in_bfloat16(tmp_path: Path) -> None:
    """A bf16 HF model is written in bf16 (half float32's bytes), the query kernel too (its
    scale, 1/sqrt(32) here, is applied at run time). MaxText loads it as the float32 import of
    the same weights, bit for bit. Exported (in the source's dtype, by default), it is the bf16
    model again, bit for bit."""
    import torch
    from orbax.checkpoint import v1 as ocp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        make_hf_model(tmp_path / "source", "llama3", head_dim=32), dtype=torch.bfloat16
    )
    model.save_pretrained(tmp_path / "bf16")
    model.to(torch.float32).save_pretrained(tmp_path / "fp32")
    loaded, stored = {}, {}
    for name in ("bf16", "fp32"):
        (tmp_path / f"run-{name}").mkdir()
        exp = experiment(tmp_path / f"run-{name}", tmp_path / name)
        with runtime(exp) as run:
            step = run.import_hf(tmp_path / name) / hf.IMPORT_STEP
            config = hf_mapping.maxtext_config(run.backend_args().argv)
            _, params, _ = hf_mapping.abstract_model(config)
            loaded[name] = hf.load_params(config, params, step)
            if name == "bf16":
                exported = run.export_hf(None, tmp_path / "bf16-again")
        tree = ocp.metadata(step, checkpointable_name="items").metadata["params"]
        stored[name] = {k: str(metadata_leaf(tree, k).dtype) for k in params}
    assert set(stored["fp32"].values()) == {"float32"}
    assert set(stored["bf16"].values()) == {"bfloat16"}
    for key, value in loaded["fp32"].items():
        assert loaded["bf16"][key].dtype == value.dtype == np.float32
        np.testing.assert_array_equal(loaded["bf16"][key], value, err_msg=key)
    source, again = tensors(tmp_path / "bf16"), tensors(exported)
    assert sorted(again) == sorted(source)
    for name, tensor in source.items():
        assert again[name].dtype == tensor.dtype and np.array_equal(again[name], tensor), name
    assert read_config(exported) == read_config(tmp_path / "bf16")  # "dtype": "bfloat16" too


def metadata_leaf(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("-"):
        tree = tree[part]
    return tree
