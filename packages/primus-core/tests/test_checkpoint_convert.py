"""init_from and `primus checkpoint import|export` around a backend's conversion hooks: the
architecture check, staging (nothing half-written), import once, provenance. The toy backend
converts by copying files; the real conversions are tested in each backend's package."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from primus.core.backend.backend_registry import BackendRegistry
from primus.core.checkpoint.inspect import inspect_checkpoint
from primus.core.checkpoint.provenance import PROVENANCE_FILE
from primus.core.config import ParamSchema, ParamSpec
from primus.core.errors import ConfigError
from primus.core.runtime import PrimusRuntime, resolution

from .conftest import EVENTS, ToyAdapter


class ConvertingToy(ToyAdapter):
    """Its native checkpoint is `weights.bin` (the safetensors file, copied) in `ckpt`."""

    capabilities = frozenset({"hf-import", "hf-export"})
    fail_import = False

    def param_schema(self) -> ParamSchema:
        return ParamSchema({**super().param_schema().specs, "ckpt": ParamSpec(str)})

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        return {"layers": hf_config["num_hidden_layers"], "optim": {"beta": 0.9}}

    def hf_import_dir(self, backend_args: Any) -> Path:
        return Path(backend_args["ckpt"])

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        EVENTS.append("import_hf")
        shutil.copyfile(hf_dir / "model.safetensors", out / "weights.bin")
        if self.fail_import:
            raise ConfigError(f"{hf_dir / 'model.safetensors'}: tensor 'lm_head.weight' missing")

    def export_hf(self, backend_args: Any, iteration: int | None, out: Path) -> None:
        shutil.copyfile(Path(backend_args["ckpt"]) / "weights.bin", out / "model.safetensors")
        (out / "config.json").write_text(json.dumps({"model_type": "llama"}))


def _hf_dir(folder: Path, layers: int = 2) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama",
                                                    "num_hidden_layers": layers}))  # fmt: skip
    header = b'{"__metadata__":{}}'
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


@pytest.fixture
def exp(toy_backend, write, tmp_path):
    """An experiment of the converting toy with init_from (layers 2, beta 0.9 from the preset)."""
    BackendRegistry.register_adapter(
        "ctoy", type("ConvertingToyT", (ConvertingToy, toy_backend), {})
    )
    ConvertingToy.fail_import = False
    _hf_dir(tmp_path / "hf")
    return write(
        "exp.yaml",
        f"""
        workspace: {tmp_path / "ws"}
        exp_name: run
        modules:
          trainer:
            framework: ctoy
            config: toy_trainer.yaml
            init_from:
              hf: {tmp_path / "hf"}
            overrides:
              layers: 2
              optim: {{beta: 0.9}}
              ckpt: {tmp_path / "ckpt"}
        """,
    )


def test_init_from_imports_once_then_the_run_keeps_its_own(exp, tmp_path) -> None:
    PrimusRuntime(exp).run()
    assert EVENTS.index("import_hf") < EVENTS.index("trainer.setup")
    assert (tmp_path / "ckpt" / "weights.bin").read_bytes() == (
        tmp_path / "hf" / "model.safetensors"
    ).read_bytes()
    record = json.loads((tmp_path / "ckpt" / PROVENANCE_FILE).read_text())
    assert record["initial_weights"]["hf"] == str(tmp_path / "hf")
    assert record["backend"]["name"] == "ctoy"
    assert "init_from:\n      hf: " in record["experiment"]  # the resolved experiment, runnable
    EVENTS.clear()
    PrimusRuntime(exp).run()  # a resumed run: the folder is there, nothing is imported again
    assert "import_hf" not in EVENTS and "trainer.train" in EVENTS


def test_architecture_mismatch_names_each_field_with_both_values(exp, tmp_path) -> None:
    shutil.rmtree(tmp_path / "hf")
    _hf_dir(tmp_path / "hf", layers=3)
    with pytest.raises(ConfigError) as err:
        PrimusRuntime(exp, ["optim.beta=0.5"])
    text = str(err.value)
    assert re.search(r"layers: 3 in the HF config, 2 in the experiment \(\S*exp.yaml:10\)", text)
    assert "optim.beta: 0.9 in the HF config, 0.5 in the experiment (cli (optim.beta=0.5))" in text
    assert err.value.origin is not None and err.value.origin.line == 8  # init_from.hf's line
    assert "primus checkpoint preset --hf" in (err.value.hint or "")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{hf: /nonexistent}", "is not a Hugging Face model directory"),
        ("{path: x}", "'init_from' must be {hf: <Hugging Face model directory>}"),
        ("{hf: [1]}", "'init_from.hf' must be a directory path"),
    ],
)
def test_bad_init_from_is_refused_where_it_is_written(exp, value, message) -> None:
    text = exp.read_text()
    start = text.index("init_from:")
    end = text.index("overrides:")
    exp.write_text(text[:start] + f"init_from: {value}\n    " + text[end:])
    with pytest.raises(ConfigError, match=message) as err:
        resolution.load(exp, [], None)
    assert err.value.origin is not None and err.value.origin.line == 7


def test_a_backend_without_import_refuses_init_from(exp, toy_backend, tmp_path) -> None:
    text = exp.read_text().replace("framework: ctoy", "framework: toy")
    exp.write_text(text[: text.index("      ckpt:")])
    with pytest.raises(ConfigError, match="the toy backend does not provide hf-import") as err:
        PrimusRuntime(exp)
    assert "backends that do: ctoy, maxtext, megatron, torchtitan;" in str(err.value.hint)


def test_failed_import_leaves_nothing_and_import_refuses_a_full_folder(exp, tmp_path) -> None:
    ConvertingToy.fail_import = True
    with pytest.raises(ConfigError, match=r"tensor 'lm_head\.weight' missing"):
        PrimusRuntime(exp).import_hf(tmp_path / "hf")
    assert not (tmp_path / "ckpt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt")] == []
    ConvertingToy.fail_import = False
    assert PrimusRuntime(exp).import_hf(tmp_path / "hf") == tmp_path / "ckpt"
    with pytest.raises(ConfigError, match="already holds a checkpoint"):
        PrimusRuntime(exp).import_hf(tmp_path / "hf")


def test_export_writes_hf_with_provenance_and_never_clobbers(exp, tmp_path) -> None:
    PrimusRuntime(exp).import_hf(tmp_path / "hf")
    out = tmp_path / "exported"
    assert PrimusRuntime(exp).export_hf(None, out) == out
    assert (out / "model.safetensors").read_bytes() == (
        tmp_path / "hf" / "model.safetensors"
    ).read_bytes()
    with pytest.raises(ConfigError, match="exists and is not empty"):
        PrimusRuntime(exp).export_hf(None, out)
    PrimusRuntime(exp).export_hf(None, out, force=True)
    info = inspect_checkpoint(out)
    assert info["format"] == "huggingface"
    prov = info["provenance"]
    assert prov["initial_weights"]["hf"] == str(tmp_path / "hf")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert prov["checkout"]["commit"] == head.stdout.strip()  # the suite runs in a checkout
    assert len(prov["checkout"]["uv_lock_sha256"]) == 64
