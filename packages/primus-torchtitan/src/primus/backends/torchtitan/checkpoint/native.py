"""TorchTitan checkpoints: model presets (the `model:` section of model/flavors.py) from HF
configs, and what a DCP checkpoint (`step-N` folders) holds."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from primus.core.backend.upstream_source import source_defaults
from primus.core.checkpoint.dcp import dcp_summary, numbered
from primus.core.checkpoint.hf import HFArchitecture, check_fixed_scaling
from primus.core.errors import ConfigError

# Primus family -> TorchTitan family (flavors.FAMILIES)
FAMILIES = {"llama3": "llama3", "qwen3": "qwen3"}
TRAINING_STATE = ("optimizer.", "train_state.", "lr_scheduler.", "dataloader.")


FIXED_SCALING = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama_scaling_defaults() -> dict[str, float]:
    """The Llama-3 scaling parameters TorchTitan's RoPE fixes (the factor is a preset key,
    `model.rope_scaling_factor`), read from its source when it is there, so that deriving a
    preset imports neither TorchTitan nor torch."""
    found = source_defaults("torchtitan", "models/common/rope.py", "RoPE.Config")
    if found is None or not set(FIXED_SCALING) <= found.keys():
        from torchtitan.models.common import ComplexRoPE

        found = {f.name: f.default for f in dataclasses.fields(ComplexRoPE.Config)}
    return {k: float(found[k]) for k in FIXED_SCALING}


def preset_from_hf(hf_config: dict[str, Any]) -> dict[str, Any]:
    """A preset's `model:` section for the architecture of an HF config.json."""
    arch = HFArchitecture.from_config(hf_config)
    family = FAMILIES.get(arch.family)
    if family is None:
        raise ConfigError(
            f"config.json: model_type '{hf_config['model_type']}' has no TorchTitan model here",
            hint=f"torchtitan presets cover: {', '.join(FAMILIES)}",
        )
    model: dict[str, Any] = {
        "family": family,
        "dim": arch.hidden_size,
        "n_layers": arch.num_layers,
        "n_heads": arch.num_heads,
        "n_kv_heads": arch.num_kv_heads,
        "ffn_hidden_dim": arch.ffn_hidden_size,
        "vocab_size": arch.vocab_size,
        "rope_theta": arch.rope_theta,
        "max_seq_len": arch.max_position_embeddings,
        "tie_embeddings": arch.tie_embeddings,
    }
    if family == "qwen3":
        model["head_dim"] = arch.head_dim
    elif arch.head_dim != arch.hidden_size // arch.num_heads:
        raise ConfigError(
            f"config.json: 'head_dim: {arch.head_dim}' is not supported by TorchTitan's llama3 "
            f"(it uses hidden_size / num_attention_heads = {arch.hidden_size // arch.num_heads})"
        )
    if arch.rope_scaling:
        if family != "llama3":
            raise ConfigError("config.json: RoPE scaling is not supported by TorchTitan's qwen3")
        check_fixed_scaling(arch, llama_scaling_defaults(), "torchtitan")
    if family == "llama3":
        model["rope_scaling"] = "llama" if arch.rope_scaling else "none"
    if arch.rope_scaling:
        model["rope_scaling_factor"] = float(arch.rope_scaling["factor"])
    return {"model": model}


def _step_folder(path: Path) -> tuple[Path, int, list[int]] | None:
    """(step folder, its step, every saved step) for a folder of `step-N` folders or for one
    `step-N` folder holding DCP's `.metadata`; None for anything else."""
    saved = {n: p for n, p in numbered(path, "step-").items() if (p / ".metadata").is_file()}
    if saved:
        last = max(saved)
        return saved[last], last, list(saved)
    number = path.name.removeprefix("step-")
    if path.name.startswith("step-") and number.isdigit() and (path / ".metadata").is_file():
        return path, int(number), [int(number)]
    return None


def _model_shape(folder: Path) -> dict[str, Any]:
    """Dimensions read off the model tensors' shapes in the DCP metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    shapes = {k: list(v.size) for k, v in metadata.items() if isinstance(v, TensorStorageMetadata)}
    layers = {m.group(1) for k in shapes if (m := re.match(r"layers\.(\d+)\.", k))}
    vocab, dim = shapes.get("tok_embeddings.weight", [None, None])

    def first_layer(suffix: str) -> list[int] | None:
        return next((v for k, v in shapes.items() if re.match(rf"layers\.0\..*{suffix}$", k)), None)

    return {
        "vocab_size": vocab,
        "dim": dim,
        "n_layers": len(layers),
        "ffn_hidden_dim": (first_layer(r"\.w1\.weight") or [0])[0] or None,
        "q_proj": first_layer(r"\.wq\.weight"),
        "kv_proj": first_layer(r"\.wk\.weight"),
        "tie_embeddings": "lm_head.weight" not in shapes,
    }


def inspect_checkpoint(path: Path) -> dict[str, Any] | None:
    """Step, model shape (from tensor shapes) and size of a TorchTitan DCP checkpoint."""
    found = _step_folder(path) if path.is_dir() else None
    if found is None:
        return None
    folder, step, saved = found
    size = dcp_summary(folder, lambda key: not key.startswith(TRAINING_STATE))
    return {
        "format": "torchtitan DCP (torch.distributed.checkpoint)",
        "backend": "torchtitan",
        "iteration": step,
        "iterations_saved": saved,
        "folder": str(folder),
        "model": _model_shape(folder),
        # DCP reshards on load: the layout is only the number of ranks that wrote files
        "parallel": {"saving_ranks": size["files"]},
        "size": size,
    }


INITIAL_LOAD = "checkpoint.initial_load_path"


def check_initial_load(module: Any) -> None:
    """`checkpoint.initial_load_path` (of `module`, a ModuleConfig) names what TorchTitan reads:
    it is read only with checkpoint.enable (else the run starts from scratch, silently), as an
    absolute path (TorchTitan refuses any other once imported), a local folder that exists
    (else TorchTitan's ValueError after start-up) holding what it loads: DCP's `.metadata`, or
    with `checkpoint.initial_load_in_hf` safetensors (else DCP's traceback at the first step)."""
    section = module.params.get("checkpoint")
    section = section if isinstance(section, dict) else {}
    value, in_hf = section.get("initial_load_path"), section.get("initial_load_in_hf") is True
    if not value:
        return
    if section.get("enable") is not True:
        raise module.error(
            INITIAL_LOAD,
            f"{INITIAL_LOAD} is read only with checkpoint.enable: true (TorchTitan's default: "
            "false): the run would start from scratch",
            hint="set checkpoint.enable: true (or start from an HF model with init_from: "
            "{hf: DIR})",
        )
    text = str(value).strip()
    if "://" in text:  # object storage: TorchTitan reads it
        return
    path = Path(text).expanduser()
    if not text.startswith("/"):
        raise module.error(INITIAL_LOAD, f"{INITIAL_LOAD}: TorchTitan takes an absolute path, "
                           f"not {text!r}", hint=f"set it to {path.resolve()}")  # fmt: skip
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise module.error(INITIAL_LOAD, f"{INITIAL_LOAD}: {path} {what}",
                           hint="name a step-N folder of a TorchTitan checkpoint")  # fmt: skip
    hf = any(path.glob("*.safetensors"))
    if in_hf and not hf:
        raise module.error(
            INITIAL_LOAD,
            f"{INITIAL_LOAD}: {path} holds no *.safetensors, and checkpoint.initial_load_in_hf "
            "reads an HF model's",
            hint="name an HF model folder, or set checkpoint.initial_load_in_hf: false for a "
            "TorchTitan (DCP) checkpoint",
        )
    if in_hf or (path / ".metadata").is_file():
        return
    saved = _step_folder(path)
    if saved is not None:
        hint = f"name one of its step folders, e.g. {saved[0]} (the latest)"
    elif hf:
        hint = ("start from an HF model with init_from: {hf: DIR} (Primus imports it), or set "
                "checkpoint.initial_load_in_hf: true")  # fmt: skip
    else:
        hint = "name a step-N folder of a TorchTitan checkpoint"
    what = "an HF model, not a" if hf and saved is None else "no"
    raise module.error(INITIAL_LOAD, f"{INITIAL_LOAD}: {path} holds {what} DCP checkpoint "
                       "(no .metadata)", hint=hint)  # fmt: skip
