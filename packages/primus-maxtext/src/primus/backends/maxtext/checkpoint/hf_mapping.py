"""The HF <-> MaxText mapping: MaxText's own conversion tables for a run's model, and the
per-tensor work of an import and an export (slots, casts, MaxText's hooks).

The names, shapes and per-tensor transforms are MaxText's (`checkpoint_conversion.utils`:
PARAM_MAPPING, HOOK_FNS, HF_SHAPE, and `process_maxtext_param` for export); Primus adds the
checks that name the file and tensor, and the casts that run without the GIL.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from primus.backends.maxtext.checkpoint.native import DECODER_BLOCKS, LLAMA31_SCALING
from primus.backends.maxtext.checkpoint.query_record import CONVERSION_HOOK
from primus.core.checkpoint.hf_tensors import HFTensors
from primus.core.errors import ConfigError

# Primus family -> the MaxText model whose conversion tables fit it (PARAM_MAPPING's keys)
UPSTREAM_MODELS = {
    "llama3": "llama3.1-8b",
    "qwen2.5": "qwen2.5-7b",
    "qwen3": "qwen3-8b",
    "mixtral": "mixtral-8x7b",
}
MODEL_TYPES = {"llama3": "llama", "qwen2.5": "qwen2", "qwen3": "qwen3", "mixtral": "mixtral"}
# safetensors dtypes an import takes (numpy knows bfloat16 once JAX has loaded ml_dtypes)
FLOAT_CODES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


@dataclass
class Tables:
    """One run's MaxText config and the upstream conversion tables for its family."""

    config: Any  # MaxText's HyperParameters
    hf_config: dict[str, Any]
    mapping: dict[str, Any]  # MaxText key -> HF name(s), nested per stacked axis
    hooks: dict[str, Any]
    hf_shapes: dict[str, list[int]]
    params: dict[str, Any]  # MaxText key -> abstract leaf (shape, dtype)


def _family(config: Any) -> str:
    for family, block in DECODER_BLOCKS.items():
        if config.decoder_block.value == block:
            return family
    raise ConfigError(
        f"MaxText decoder_block '{config.decoder_block.value}' has no HF conversion in Primus",
        hint="supported: " + ", ".join(f"{b} ({f})" for f, b in DECODER_BLOCKS.items()),
    )


def hf_config_from_maxtext(
    config: Any, rope_factor: float | None, dtype: np.dtype | None = None
) -> dict[str, Any]:
    """config.json's values for the model of a MaxText config (the inverse of the preset);
    `rope_factor`: Primus's rope_scaling_factor (None: MaxText's own 8); `dtype`: the
    tensors' (default: the weights'). MaxText keeps no context length of the model: the
    trained one (max_target_length) stands for it, at least Llama-3 RoPE's original context
    (which transformers checks). An export from an HF import writes the import's config."""
    family = _family(config)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(config.rope_max_timescale)}
    context = config.max_target_length
    if family == "llama3" and config.rope_type.startswith("llama3.1") and config.rope_use_scale:
        rope |= {"rope_type": "llama3", "factor": float(rope_factor or 8.0), **LLAMA31_SCALING}
        original = int(LLAMA31_SCALING["original_max_position_embeddings"])
        rope["original_max_position_embeddings"] = original
        context = max(context, original)
    values: dict[str, Any] = {
        "model_type": MODEL_TYPES[family],
        "hidden_size": config.emb_dim,
        "intermediate_size": config.moe_mlp_dim if config.num_experts > 1 else config.mlp_dim,
        "num_hidden_layers": config.num_decoder_layers,
        "num_attention_heads": config.num_query_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.normalization_layer_epsilon,
        "rope_parameters": rope,
        "tie_word_embeddings": bool(config.logits_via_embedding),
        "max_position_embeddings": context,
        "dtype": str(dtype or np.dtype(config.weight_dtype)),
    }
    if family == "mixtral":
        values |= {
            "num_local_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "router_aux_loss_coef": config.load_balance_loss_weight,
        }
    return values


def maxtext_config(argv: list[str]) -> Any:
    """MaxText's HyperParameters for a run's argv (as its trainer builds them)."""
    from maxtext.configs import pyconfig

    return pyconfig.initialize(argv)


def tables(
    config: Any, hf_config: dict[str, Any], saving_to_hf: bool, query_at_run_time: bool
) -> Tables:
    """MaxText's conversion tables for `config`'s family, and its parameters' shapes;
    `query_at_run_time`: the query weights stay HF's, unscaled (model.query_scale)."""
    from maxtext.checkpoint_conversion.utils.hf_shape import HF_SHAPE
    from maxtext.checkpoint_conversion.utils.param_mapping import HOOK_FNS, PARAM_MAPPING

    family = _family(config)
    model = UPSTREAM_MODELS[family]
    hf_config = dict(hf_config)
    hf_config.setdefault("head_dim", config.head_dim)
    if family == "qwen2.5":  # Qwen2's QKV biases are built in, not a config.json option
        hf_config["attention_bias"] = True
    hooks = HOOK_FNS[model](hf_config, config, config.scan_layers, saving_to_hf=saving_to_hf)
    if family == "llama3" and not config.rope_type.startswith("llama3.1"):
        # MaxText's Llama tables assume its interleaved Llama-3.1 RoPE; the default RoPE
        # rotates halves as HF does, so q and k keep HF's layout.
        hooks = {k: _without(v, "adjust_rope") for k, v in hooks.items()}
    if query_at_run_time:
        hooks = {k: _without(v, CONVERSION_HOOK) for k, v in hooks.items()}
    _, params, _ = abstract_model(config)
    return Tables(
        config, hf_config, PARAM_MAPPING[model](hf_config, config, config.scan_layers), hooks,
        HF_SHAPE[model](hf_config), params,
    )  # fmt: skip


def abstract_model(config: Any) -> tuple[Any, dict[str, Any], Any]:
    """(MaxText's Linen model, its parameters' abstract leaves by MaxText key, their treedef).
    The leaves are replicated on the devices: conversion reads and writes whole tensors."""
    import flax.linen as nn
    import jax

    from maxtext.checkpoint_conversion.utils.utils import param_key_parts_from_path
    from maxtext.common.common_types import MODEL_MODE_TRAIN
    from maxtext.layers import quantizations
    from maxtext.models import models
    from maxtext.utils import maxtext_utils

    mesh = jax.sharding.Mesh(maxtext_utils.create_device_mesh(config), config.mesh_axes)
    quant = quantizations.configure_quantization(config)
    linen = models.transformer_as_linen(config, mesh, quant=quant, model_mode=MODEL_MODE_TRAIN)
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        maxtext_utils.get_abstract_param(linen, config),
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
    )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = {
        "-".join(param_key_parts_from_path(path)): jax.ShapeDtypeStruct(
            leaf.value.shape, leaf.value.dtype, sharding=replicated
        )
        for path, leaf in flat
    }
    return linen, params, treedef


def _without(hooks: Any, name: str) -> Any:
    if isinstance(hooks, list):
        return [h for h in hooks if h.__name__ != name]
    return hooks


def _stack_axes(tables: Tables, key: str, names: Any, ndim: int) -> tuple[int, ...]:
    """Where MaxText stacks the HF tensors of `names` (`process_maxtext_param`'s rule)."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import nesting_depth, stacked_axes

    depth = nesting_depth(names)
    if depth > 1:
        return tuple(stacked_axes(key, tables.config, depth))
    axis = tables.config.param_scan_axis
    return (axis if tables.config.scan_layers and ndim > axis else 0,)


def _slots(names: Any, axes: tuple[int, ...], shape: tuple[int, ...]) -> Iterator[tuple[Any, str]]:
    """(index into a MaxText parameter of `shape`, HF name) for each HF tensor of nested
    `names`, stacked on `axes`."""

    def walk(names: Any, at: tuple[int, ...]) -> Iterator[tuple[Any, str]]:
        if not isinstance(names, list):
            index: list[Any] = [slice(None)] * len(shape)
            for axis, i in zip(axes, at, strict=True):
                index[axis] = i
            yield tuple(index), names
            return
        if len(names) != shape[axes[len(at)]]:  # no slot left unfilled
            raise ConfigError(f"{len(names)} HF tensors from {names[0]} on for an axis of "
                              f"{shape[axes[len(at)]]} in MaxText")  # fmt: skip
        for i, sub in enumerate(names):
            yield from walk(sub, (*at, i))

    yield from walk(names, ())


def _widen(tensor: np.ndarray, dtype: Any) -> np.ndarray:
    """`tensor` in `dtype`; bfloat16 to float32 as integer shifts, which numpy runs without
    the GIL (ml_dtypes' own cast holds it, and the import's threads would queue on it)."""
    if tensor.dtype.name == "bfloat16" and np.dtype(dtype) == np.float32:
        return np.left_shift(tensor.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
    return tensor.astype(dtype)


def cast(tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`tensor` in `dtype`; float32 to bfloat16 rounded to nearest even as integer
    arithmetic, without the GIL (as `_widen`), NaN kept NaN."""
    if tensor.dtype != np.float32 or dtype != _bfloat16():
        return tensor.astype(dtype)
    bits = tensor.view(np.uint32)  # any layout: the item size is the same
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded >>= 16
    if (nan := np.isnan(tensor)).any():
        rounded[nan] = 0x7FC0
    return rounded.astype(np.uint16).view(dtype)


def slot_jobs(tables: Tables, key: str) -> Iterator[tuple[str, Any, str, tuple[int, ...]]]:
    """(MaxText key, index into its parameter, HF name, shape of one HF tensor there) for
    each HF tensor of MaxText parameter `key`."""
    names, target = tables.mapping[key], tables.params[key]
    axes = _stack_axes(tables, key, names, len(target.shape)) if isinstance(names, list) else ()
    one = tuple(d for i, d in enumerate(target.shape) if i not in axes)
    for index, name in _slots(names, axes, target.shape):
        yield key, index, name, one


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def stored_dtypes(tables: Tables, reader: HFTensors) -> dict[str, np.dtype]:
    """Each parameter's dtype in the import: bfloat16 where MaxText keeps it in float32 and
    all its HF tensors are bfloat16 (the file holds no more; MaxText's restore widens it back,
    exactly), else the parameter's own."""
    stored = {}
    for key, leaf in tables.params.items():
        names = list(hf_names(tables.mapping[key]))
        bf16 = names and all(
            name in reader.entries and reader.entries[name][2]["dtype"] == "BF16" for name in names
        )
        stored[key] = _bfloat16() if bf16 and leaf.dtype == np.float32 else np.dtype(leaf.dtype)
    return stored


def _fill(tables: Tables, reader: HFTensors, built: dict[str, np.ndarray],
          job: tuple[str, Any, str, tuple[int, ...]]) -> None:  # fmt: skip
    """Read one HF tensor, transform it by MaxText's hooks (in the parameter's dtype) and
    write it to its slot (exactly in a bfloat16 slot: the hooks only move and reshape)."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    key, index, name, one = job
    tensor, hooks = reader.get(name, tables.hf_shapes[name]), tables.hooks.get(key)
    if hooks is not None or tensor.dtype != built[key].dtype:
        tensor = _widen(tensor, tables.params[key].dtype)
    if hooks is not None:  # MaxText's hooks take the tensor in the parameter's dtype
        tensor = np.asarray(apply_hook_fns(tensor, one, hooks))
    if tensor.shape != one:
        raise ConfigError(f"{reader.where}: tensor '{name}' gives shape {list(tensor.shape)} "
                          f"in MaxText's {key}, which holds {list(one)} per tensor")  # fmt: skip
    built[key][index] = tensor  # cast to the slot's dtype


def build_param(
    tables: Tables, reader: HFTensors, key: str, dtype: np.dtype, pool: Any
) -> np.ndarray:
    """MaxText parameter `key`, filled in place from its HF tensors in `dtype` (its
    `stored_dtypes` entry) by the `pool`'s threads, each reading, transforming and writing one
    HF tensor at a time."""
    built = {key: np.empty(tables.params[key].shape, dtype)}
    for _ in pool.map(functools.partial(_fill, tables, reader, built), slot_jobs(tables, key)):
        pass
    return built[key]


def hf_names(names: Any) -> Iterator[str]:
    """The HF names of a (nested) mapping entry."""
    if isinstance(names, list):
        for sub in names:
            yield from hf_names(sub)
    elif names is not None:
        yield names


def export_dtype(config: Any, name: str | None) -> np.dtype:
    """The dtype an export writes: `name` (Primus's `export_dtype`, else the HF source's),
    else the weights'."""
    return _bfloat16() if name == "bfloat16" else np.dtype(name or config.weight_dtype)


def export_layout(found: Tables, dtype: np.dtype) -> dict[str, tuple[list[int], str]]:
    """The HF tensors an export writes (name -> shape, safetensors dtype), in MaxText's
    parameter order."""
    code = FLOAT_CODES[dtype.name]
    return {
        name: (list(found.hf_shapes[name]), code)
        for key in found.params
        for name in hf_names(found.mapping[key])
    }
