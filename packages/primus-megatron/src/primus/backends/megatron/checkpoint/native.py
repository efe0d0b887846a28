"""Megatron checkpoints: model presets from HF configs, and what a distributed checkpoint
(`iter_NNNNNNN` folders beside `latest_checkpointed_iteration.txt`) holds."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

from primus.core.backend.upstream_source import source_defaults
from primus.core.checkpoint.dcp import dcp_summary, numbered
from primus.core.checkpoint.hf import HFArchitecture, check_fixed_scaling
from primus.core.errors import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"
LAST_FILE = "metadata.json"  # a torch_dist checkpoint folder's last file, after its shards


FIXED_SCALING = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def fixed_rope_scaling() -> dict[str, float]:
    """The Llama-3 RoPE scaling constants Megatron fixes (the defaults of
    `RotaryEmbedding._apply_scaling`; only the factor is an argument), read from its source
    when it is there, so that deriving a preset imports neither Megatron nor torch."""
    found = source_defaults(
        "megatron", "core/models/common/embeddings/rotary_pos_embedding.py",
        "RotaryEmbedding._apply_scaling",
    )  # fmt: skip
    if found is None or not set(FIXED_SCALING) <= found.keys():
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        fixed = inspect.signature(RotaryEmbedding._apply_scaling).parameters
        found = {k: fixed[k].default for k in FIXED_SCALING}
    return {k: float(found[k]) for k in FIXED_SCALING}


def preset_from_hf(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Megatron arguments (dest names) for the architecture of an HF config.json."""
    arch = HFArchitecture.from_config(hf_config)
    check_fixed_scaling(arch, fixed_rope_scaling(), "megatron")
    preset: dict[str, Any] = {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_heads,
        "group_query_attention": arch.num_kv_heads != arch.num_heads,
        "num_query_groups": arch.num_kv_heads,
        "kv_channels": arch.head_dim,
        "seq_length": min(4096, arch.max_position_embeddings),
        "max_position_embeddings": arch.max_position_embeddings,
        "vocab_size": arch.vocab_size,
        # pad no further than the HF vocabulary already is, so the shapes stay HF's
        "make_vocab_size_divisible_by": math.gcd(arch.vocab_size, 128),
        "position_embedding_type": "rope",
        "rotary_base": _integer_theta(arch.rope_theta),
        "use_rope_scaling": arch.rope_scaling is not None,
        **({"rope_scaling_factor": arch.rope_scaling["factor"]} if arch.rope_scaling else {}),
        "normalization": "RMSNorm",
        "layernorm_epsilon": arch.norm_eps,
        "swiglu": True,
        "add_bias_linear": False,
        "add_qkv_bias": arch.qkv_bias,
        "qk_layernorm": arch.qk_norm,
        "untie_embeddings_and_output_weights": not arch.tie_embeddings,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    }
    if arch.num_experts:
        preset |= {
            "num_experts": arch.num_experts,
            "moe_router_topk": arch.experts_per_token,
            "moe_ffn_hidden_size": arch.ffn_hidden_size,
            "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": arch.router_aux_loss_coef,
        }
    return preset


def _integer_theta(theta: float) -> int:
    if theta != int(theta):
        raise ConfigError(f"config.json: 'rope_theta: {theta}' must be an integer for megatron")
    return int(theta)


def _iteration_folder(path: Path) -> tuple[Path, int, list[int]] | None:
    """(iteration folder, its iteration, every saved iteration) for a checkpoint folder holding
    the tracker file, or for one `iter_N` folder; None for anything else."""
    if (path / TRACKER).is_file():
        saved = numbered(path, "iter_")
        text = (path / TRACKER).read_text().strip()
        iteration = int(text) if text.isdigit() else max(saved, default=0)
        if iteration in saved:
            return saved[iteration], iteration, list(saved)
        return None
    number = path.name.removeprefix("iter_")
    if path.name.startswith("iter_") and number.isdigit() and (path / LAST_FILE).is_file():
        return path, int(number), [int(number)]
    return None


def iteration_dir(folder: Path, iteration: int | None = None) -> Path:
    """The `iter_N` folder of the checkpoint folder `folder`: the latest, or `iteration`."""
    found = _iteration_folder(folder)
    if found is None:
        raise ConfigError(f"{folder}: no Megatron checkpoint (no {TRACKER} and iter_N folder)")
    latest, number, saved = found
    if iteration is None or iteration == number:
        return latest
    if iteration not in saved:
        raise ConfigError(f"{folder}: no checkpoint of iteration {iteration}",
                          hint=f"saved: {', '.join(map(str, saved))}")  # fmt: skip
    return numbered(folder, "iter_")[iteration]


def latest_iteration(folder: Path) -> int | None:
    """The iteration of the latest checkpoint in `folder` (its tracker file's), or None."""
    found = _iteration_folder(folder)
    return None if found is None else found[1]


def complete_iterations(folder: Path) -> list[int]:
    """The iterations of the complete checkpoints in `folder` (a save that was killed leaves
    its `iter_N` folder without LAST_FILE), in increasing order."""
    return [i for i, path in numbered(folder, "iter_").items() if (path / LAST_FILE).is_file()]


def is_imported(folder: Path) -> bool:
    """Whether the latest checkpoint in `folder` is an HF import (iteration 0: model only;
    a run never saves iteration 0 itself)."""
    tracker = folder / TRACKER
    return tracker.is_file() and tracker.read_text().strip() == "0"


def inspect_checkpoint(path: Path) -> dict[str, Any] | None:
    """Iteration, model shape and parallel layout (from the saved args), and size."""
    found = _iteration_folder(path)
    if found is None:
        return None
    from primus.backends.megatron.config.bridge import silence_import_notices

    silence_import_notices()
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    folder, iteration, saved = found
    args = load_common_state_dict(str(folder))["args"]
    model_parallel = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    model = {
        key: getattr(args, key, None)
        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                    "num_query_groups", "kv_channels", "padded_vocab_size", "num_experts",
                    "untie_embeddings_and_output_weights", "params_dtype")
    }  # fmt: skip
    return {
        "format": "megatron distributed checkpoint (torch_dist)",
        "backend": "megatron",
        "iteration": iteration,
        "iterations_saved": saved,
        "folder": str(folder),
        "model": {k: str(v) if k == "params_dtype" else v for k, v in model.items()},
        "parallel": {
            "tensor": args.tensor_model_parallel_size,
            "pipeline": args.pipeline_model_parallel_size,
            "context": args.context_parallel_size,
            "expert": args.expert_model_parallel_size,
            "data": args.world_size // model_parallel,
            "world_size": args.world_size,
            "distributed_optimizer": args.use_distributed_optimizer,
        },
        "size": dcp_summary(folder, lambda key: not key.startswith("optimizer.")),
    }


def check_load(module: Any) -> None:
    """`load` (of `module`, a ModuleConfig) names a folder Megatron resumes from: one that holds
    its tracker file, or is still empty, or is `save` (the first run writes it). Megatron
    takes any other folder for one without a checkpoint, and trains from random weights."""
    from primus.core.checkpoint.hf import is_hf_directory

    value = module.params.get("load")
    if not value or "://" in str(value):  # unset, or object storage (Megatron reads it)
        return
    path = Path(str(value)).expanduser()
    if (path / TRACKER).is_file():
        return
    save = module.params.get("save")
    if not path.exists():
        if save and Path(str(save)).expanduser().resolve() == path.resolve():
            return
        raise module.error("load", f"load: {path} does not exist: Megatron would train from "
                           "random weights", hint="name a checkpoint folder (the one holding "
                           f"{TRACKER}), or remove load to start from scratch")  # fmt: skip
    if not path.is_dir():
        raise module.error("load", f"load: {path} is not a folder",
                           hint=f"name a checkpoint folder (the one holding {TRACKER})")  # fmt: skip
    inner = path / "checkpoints"
    if is_hf_directory(path):
        what, hint = "an HF model", "start from it with init_from: {hf: DIR} (Primus imports it)"
    elif path.name.startswith("iter_") and (path.parent / TRACKER).is_file():
        what, hint = f"one iteration of {path.parent}", f"set load: {path.parent}"
    elif (inner / TRACKER).is_file():
        what, hint = "a run directory", f"set load: {inner}"
    else:
        return  # empty, or a first save that did not finish: Megatron starts afresh
    raise module.error("load", f"load: {path} is {what}, with no {TRACKER}: Megatron would "
                       "train from random weights", hint=hint)  # fmt: skip
