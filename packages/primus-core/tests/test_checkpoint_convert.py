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
    """Its native checkpoint is `weights.bin` (the safetensors file, copied) in `ckpt`; its
    export writes the config.json the toy can derive (layers, and a guessed context)."""

    capabilities = frozenset({"hf-import", "hf-export"})
    fail_import = False
    hf_export_dtype_key = "export.dtype"

    def param_schema(self) -> ParamSchema:
        specs = {"ckpt": ParamSpec(str), "export.dtype": ParamSpec(str)}
        return ParamSchema({**super().param_schema().specs, **specs})

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        return {"layers": hf_config["num_hidden_layers"], "optim": {"beta": 0.9}}

    def hf_import_dir(self, backend_args: Any) -> Path:
        return Path(backend_args["ckpt"])

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        EVENTS.append("import_hf")
        shutil.copyfile(hf_dir / "model.safetensors", out / "weights.bin")
        if self.fail_import:
            raise ConfigError(f"{hf_dir / 'model.safetensors'}: tensor 'lm_head.weight' missing")

    def export_hf(self, backend_args: Any, iteration: int | None, out: Path,
                  dtype: str | None) -> None:  # fmt: skip
        EVENTS.append(f"export_hf({dtype})")
        shutil.copyfile(Path(backend_args["ckpt"]) / "weights.bin", out / "model.safetensors")
        derived = {"model_type": "llama", "num_hidden_layers": backend_args["layers"],
                   "max_position_embeddings": 8192, "architectures": ["LlamaForCausalLM"]}  # fmt: skip
        (out / "config.json").write_text(json.dumps(derived))


SOURCE_CONFIG = {"model_type": "llama", "max_position_embeddings": 131072, "rope_scaling":
                 {"rope_type": "llama3", "factor": 32.0}, "torch_dtype": "bfloat16"}  # fmt: skip


def _hf_dir(folder: Path, layers: int = 2) -> Path:
    """An HF model directory: config.json, a tokenizer, generation_config.json and one bf16
    tensor."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**SOURCE_CONFIG, "num_hidden_layers": layers}))
    (folder / "tokenizer.json").write_text('{"from": "hf"}')
    (folder / "generation_config.json").write_text('{"eos_token_id": 2}')
    header = b'{"__metadata__":{},"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}'
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
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
        ("{path: x}", "'init_from' must be {hf: <Hugging Face model directory>, adapter: <PEFT"),
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


def test_an_hf_config_that_is_not_utf8_is_refused(exp, tmp_path) -> None:
    (tmp_path / "hf" / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"hf/config.json: not UTF-8 text: byte 0"):
        PrimusRuntime(exp, [])


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
    with pytest.raises(ConfigError, match=r"cannot write .*: .*model.safetensors is not a folder"):
        PrimusRuntime(exp).export_hf(None, out / "model.safetensors" / "x")
    PrimusRuntime(exp).export_hf(None, out, force=True)
    info = inspect_checkpoint(out)
    assert info["format"] == "huggingface"
    prov = info["provenance"]
    assert prov["initial_weights"]["hf"] == str(tmp_path / "hf")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert prov["checkout"]["commit"] == head.stdout.strip()  # the suite runs in a checkout
    assert len(prov["checkout"]["uv_lock_sha256"]) == 64


def test_an_adapter_export_needs_a_lora_run_and_a_backend_that_writes_adapters(
    exp, tmp_path
) -> None:
    PrimusRuntime(exp).import_hf(tmp_path / "hf")
    with pytest.raises(ConfigError, match="no peft: section, so its checkpoints hold no"):
        PrimusRuntime(exp).export_adapter(None, tmp_path / "adapter")
    lora = ["peft.type=lora"]
    with pytest.raises(ConfigError, match="does not provide lora: "):
        PrimusRuntime(exp, lora, "posttrain").export_adapter(None, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_export_gives_back_the_source_config_tokenizer_and_dtype(exp, tmp_path, capsys) -> None:
    """From `init_from`, or the import's provenance (the experiment without it, the source
    moved away): the source's config.json (the toy's guessed context not written), tokenizer,
    generation_config.json and dtype; an explicit dtype option wins."""
    PrimusRuntime(exp).import_hf(tmp_path / "hf")
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    PrimusRuntime(exp).export_hf(None, tmp_path / "out")
    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text()) == source | {
        "architectures": ["LlamaForCausalLM"]
    }
    for name in ("tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()
    assert EVENTS[-1] == "export_hf(bfloat16)"
    log = capsys.readouterr().err
    assert f"bfloat16 tensors (the dtype of {tmp_path / 'hf'}, the HF model it was" in log
    PrimusRuntime(exp, ["export.dtype=float32"]).export_hf(None, out, force=True)
    assert EVENTS[-1] == "export_hf(float32)"
    assert " tensors (export.dtype set by cli (export.dtype=float32))" in capsys.readouterr().err

    without = tmp_path / "without.yaml"  # the experiment without init_from: the provenance's
    text = exp.read_text()
    without.write_text(text[: text.index("init_from:")] + text[text.index("overrides:") :])
    (tmp_path / "hf").rename(tmp_path / "moved")
    PrimusRuntime(without).export_hf(None, out, force=True)
    assert EVENTS[-1] == "export_hf(bfloat16)"
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 131072
    assert not (out / "tokenizer.json").exists()  # the folder is gone: the record has no files


def test_an_export_of_another_model_keeps_its_derived_config(exp, tmp_path, capsys) -> None:
    PrimusRuntime(exp).import_hf(tmp_path / "hf")
    text = exp.read_text()
    exp.write_text(text[: text.index("init_from:")] + text[text.index("overrides:") :])
    PrimusRuntime(exp, ["layers=3"]).export_hf(None, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["max_position_embeddings"] == 8192
    log = capsys.readouterr().err
    assert "config.json derived from the checkpoint, not " in log
    assert "(source, checkpoint: layers: 2, 3)" in log


def test_export_refuses_a_full_folder_before_the_backend_is_built(
    exp, tmp_path, monkeypatch, capsys
) -> None:
    from primus.cli.main import main

    monkeypatch.setattr("primus.core.runtime.PrimusRuntime", None)  # building it would fail
    for option in ("--hf", "--adapter"):
        with pytest.raises(SystemExit) as done:
            main(["checkpoint", "export", "--config", str(exp), option, str(tmp_path / "hf")])
        err = capsys.readouterr().err
        assert done.value.code == 2 and "exists and is not empty" in err, err
