"""MaxText checkpoints: model presets (MaxText config keys) from HF configs, and what an orbax
checkpoint (`checkpoints/N/items`) holds."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from primus.core.checkpoint.dcp import numbered
from primus.core.checkpoint.hf import HFArchitecture, check_fixed_scaling

# the folder of a run directory an HF import fills (checkpoint.hf.import_dir)
IMPORT_FOLDER = "hf_import"
# Primus family -> MaxText decoder_block
DECODER_BLOCKS = {"llama3": "llama2", "qwen2.5": "qwen2", "qwen3": "qwen3", "mixtral": "mixtral"}
# MaxText 0.2.5 hard-codes its Llama-3.1 scaling (LLaMARotaryEmbedding._apply_scaling_factor in
# maxtext/layers/embeddings.py); rope_type "llama3.1" turns it on, and Primus's
# `rope_scaling_factor` (patch maxtext.llama3_rope_factor) sets the factor.
LLAMA31_SCALING = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192.0,
}


def preset_from_hf(hf_config: dict[str, Any]) -> dict[str, Any]:
    """MaxText config keys for the architecture of an HF config.json."""
    arch = HFArchitecture.from_config(hf_config)
    check_fixed_scaling(arch, LLAMA31_SCALING, "maxtext")
    preset: dict[str, Any] = {
        "decoder_block": DECODER_BLOCKS[arch.family],
        "base_emb_dim": arch.hidden_size,
        "base_num_query_heads": arch.num_heads,
        "base_num_kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "base_mlp_dim": arch.ffn_hidden_size,
        "base_num_decoder_layers": arch.num_layers,
        "mlp_activations": ["silu", "linear"],
        "vocab_size": arch.vocab_size,
        "logits_via_embedding": arch.tie_embeddings,
        "normalize_embedding_logits": False,  # HF multiplies by the tied embedding as it is
        "normalization_layer_epsilon": arch.norm_eps,
        "rope_max_timescale": int(arch.rope_theta),  # an integer in MaxText's schema
        "rope_type": "llama3.1" if arch.rope_scaling else "default",
        "use_qk_norm": arch.qk_norm,
        "attention_bias": arch.qkv_bias,
        "enable_dropout": False,
    }
    if arch.rope_scaling:
        preset["rope_use_scale"] = True
        preset["rope_scaling_factor"] = float(arch.rope_scaling["factor"])
    if arch.num_experts:
        preset |= {
            "num_experts": arch.num_experts,
            "num_experts_per_tok": arch.experts_per_token,
            "base_moe_mlp_dim": arch.ffn_hidden_size,
            "load_balance_loss_weight": arch.router_aux_loss_coef,
        }
    return preset


def _step_folder(path: Path) -> tuple[Path, int, list[int]] | None:
    """(step folder, its step, every saved step) for orbax's folder of numbered steps or for
    one step folder (holding `_CHECKPOINT_METADATA` and `items/`); None for anything else."""

    def is_step(folder: Path) -> bool:
        return (folder / "_CHECKPOINT_METADATA").is_file() and (folder / "items").is_dir()

    saved = {n: p for n, p in numbered(path, "").items() if is_step(p)}
    if saved:
        last = max(saved)
        return saved[last], last, list(saved)
    return (
        (path, int(path.name), [int(path.name)]) if path.name.isdigit() and is_step(path) else None
    )


def _model_shape(params: dict[str, list[int]]) -> dict[str, Any]:
    """Dimensions read off the parameter shapes (scanned layers: the layer axis is axis 1)."""
    vocab, emb = params.get("params.params.token_embedder.embedding", [None, None])
    query = params.get("params.params.decoder.layers.self_attention.query.kernel")
    key = params.get("params.params.decoder.layers.self_attention.key.kernel")
    unscanned = {m.group(1) for k in params if (m := re.search(r"decoder\.layers_(\d+)\.", k))}
    return {
        "vocab_size": vocab,
        "emb_dim": emb,
        "num_decoder_layers": query[1] if query else len(unscanned),
        "num_query_heads": query[2] if query else None,
        "num_kv_heads": key[2] if key else None,
        "head_dim": query[3] if query else None,
        "logits_via_embedding": "params.params.decoder.logits_dense.kernel" not in params,
    }


def inspect_checkpoint(path: Path) -> dict[str, Any] | None:
    """Step, model shape and size (from orbax's metadata) of a MaxText orbax checkpoint."""
    found = _step_folder(path) if path.is_dir() else None
    if found is None:
        return None
    import jax
    import orbax.checkpoint as ocp

    folder, step, saved = found
    items = folder / "items"
    metadata = ocp.PyTreeCheckpointer().metadata(items)
    tree = getattr(metadata, "item_metadata", metadata)
    leaves = {
        ".".join(str(getattr(k, "key", k)) for k in keys): leaf
        for keys, leaf in jax.tree_util.tree_leaves_with_path(getattr(tree, "tree", tree))
    }
    params = {k: list(v.shape) for k, v in leaves.items() if k.startswith("params.")}
    custom = json.loads((folder / "_CHECKPOINT_METADATA").read_text()).get("custom_metadata")
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {
        "format": "maxtext orbax checkpoint",
        "backend": "maxtext",
        "iteration": step,
        "iterations_saved": saved,
        "folder": str(folder),
        "model": {**_model_shape(params), **(custom or {})},
        # orbax reshards on restore: the layout is only the processes that wrote data
        "parallel": {"saving_processes": len(list(items.glob("ocdbt.process_*")))},
        "size": {
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "tensors": len(leaves),
            "model_tensors": len(params),
            "model_parameters": sum(math.prod(s) for s in params.values()),
            "dtypes": dict(sorted(Counter(str(v.dtype) for v in leaves.values()).items())),
        },
    }


LOAD_KEYS = ("load_parameters_path", "load_full_state_path")
# what an orbax step folder (`_CHECKPOINT_METADATA`) or its `items` folder holds
ORBAX_FILES = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt")


def check_load_paths(module: Any) -> None:
    """`load_parameters_path` and `load_full_state_path` (of `module`, a ModuleConfig) name a
    local orbax checkpoint that exists: MaxText failed on anything else with orbax's traceback
    once the model was built, and an HF model folder belongs in `init_from`."""
    from primus.core.checkpoint.hf import is_hf_directory

    for key in LOAD_KEYS:
        value = module.params.get(key)
        if not value or "://" in str(value):  # unset, or object storage (orbax reads it)
            continue
        path = Path(str(value)).expanduser()
        saved = _step_folder(path) if path.is_dir() else None
        if saved is not None and saved[0] != path:
            hint = f"name one of its step folders, e.g. {saved[0]} (the latest)"
        elif is_hf_directory(path):
            hint = "start from an HF model with init_from: {hf: DIR} (Primus imports it)"
        else:
            hint = "name a step folder of a MaxText checkpoint (CHECKPOINTS/N, or its items)"
        if not path.is_dir():
            what = "is not a folder" if path.exists() else "does not exist"
            raise module.error(key, f"{key}: {path} {what}", hint)
        if not any((path / name).is_file() for name in ORBAX_FILES):
            what = "an HF model, not an" if is_hf_directory(path) else "no"
            raise module.error(key, f"{key}: {path} holds {what} orbax checkpoint", hint)
