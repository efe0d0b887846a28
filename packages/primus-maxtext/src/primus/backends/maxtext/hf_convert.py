"""HF checkpoints into and out of MaxText, with MaxText's own conversion tables.

The names, shapes and per-tensor transforms are MaxText's (`checkpoint_conversion.utils`:
PARAM_MAPPING, HOOK_FNS, HF_SHAPE, and `process_maxtext_param` for export); Primus adds the
tensor streaming, the checks that name the file and tensor, and the params-only orbax
checkpoint MaxText's `load_parameters_path` reads (`<import dir>/0/items`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primus.backends.maxtext.checkpoints import DECODER_BLOCKS, IMPORT_FOLDER, LLAMA31_SCALING
from primus.backends.maxtext.config_bridge import MaxTextArgs
from primus.core.atomic import write_atomic
from primus.core.checkpoint.convert import copy_tokenizer
from primus.core.checkpoint.dcp import numbered
from primus.core.checkpoint.hf import read_config
from primus.core.checkpoint.hf_tensors import HFTensors, SafetensorsWriter
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0

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
# zarr chunks an import writes: each is compressed in a buffer of its own, by as many threads
# as the host has cores; 16 MiB measured 2.8 GiB less peak than 64 MiB at 3B on 16 cores, no
# slower (docs/benchmarks/checkpoints.md)
CHUNK_BYTES = 16 << 20
# conversion threads (numpy's copies run without the GIL) within a parameter; 8 built the 3B
# model's parameters 1.2-1.5x faster than 4 on 16 cores, for 1 GiB more peak RSS
# (docs/benchmarks/checkpoints.md)
THREADS = min(8, os.cpu_count() or 1)
WRITE_BYTES = 1 << 30  # the most an import's save has in flight (orbax's default: unbounded)
IMPORT_STEP = "0"  # the step folder of the params-only checkpoint an import writes


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, in GiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def import_dir(config: dict[str, Any]) -> Path:
    """The folder an import fills for a run: `<run dir>/hf_import`."""
    return Path(config["base_output_directory"]) / config["run_name"] / IMPORT_FOLDER


def params_path(folder: Path) -> Path:
    """What `load_parameters_path` names for an import folder."""
    return folder / IMPORT_STEP / "items"


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
    tensors' (default: the weights')."""
    family = _family(config)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(config.rope_max_timescale)}
    if family == "llama3" and config.rope_type.startswith("llama3.1") and config.rope_use_scale:
        rope |= {"rope_type": "llama3", "factor": float(rope_factor or 8.0), **LLAMA31_SCALING}
        rope["original_max_position_embeddings"] = int(
            LLAMA31_SCALING["original_max_position_embeddings"]
        )
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
        # at least Llama-3 RoPE's original context, which transformers checks
        "max_position_embeddings": max(config.max_target_length, 8192),
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


def tables(config: Any, hf_config: dict[str, Any], saving_to_hf: bool) -> Tables:
    """MaxText's conversion tables for `config`'s family, and its parameters' shapes."""
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


def _cast(tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
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


def _slot_jobs(tables: Tables, key: str) -> Iterator[tuple[str, Any, str, tuple[int, ...]]]:
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
        names = list(_names(tables.mapping[key]))
        bf16 = names and all(
            name in reader.entries and reader.entries[name][2]["dtype"] == "BF16" for name in names
        )
        stored[key] = _bfloat16() if bf16 and leaf.dtype == np.float32 else np.dtype(leaf.dtype)
    return stored


def _narrowed(tensor: np.ndarray) -> np.ndarray | None:
    """float32 `tensor` as bfloat16 when that loses nothing (its low 16 bits are zero: a
    bfloat16 value, moved or scaled by a power of two by MaxText's hooks), else None."""
    bits = np.ascontiguousarray(tensor, np.float32).view(np.uint32)
    if np.any(bits & 0xFFFF):
        return None
    return np.right_shift(bits, 16).astype(np.uint16).view(_bfloat16())


def _fill(tables: Tables, reader: HFTensors, built: dict[str, np.ndarray], inexact: set[str],
          job: tuple[str, Any, str, tuple[int, ...]]) -> None:  # fmt: skip
    """Read one HF tensor, transform it by MaxText's hooks (in the parameter's dtype) and
    write it to its slot. A bfloat16 slot whose value the hooks made inexact in bfloat16
    (a query scaled by 1/sqrt(head_dim)) is skipped and its parameter put in `inexact`."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    key, index, name, one = job
    if key in inexact:
        return
    tensor, hooks = reader.get(name, tables.hf_shapes[name]), tables.hooks.get(key)
    if hooks is not None or tensor.dtype != built[key].dtype:
        tensor = _widen(tensor, tables.params[key].dtype)
    if hooks is not None:  # MaxText's hooks take the tensor in the parameter's dtype
        tensor = np.asarray(apply_hook_fns(tensor, one, hooks))
    if tensor.shape != one:
        raise ConfigError(f"{reader.where}: tensor '{name}' gives shape {list(tensor.shape)} "
                          f"in MaxText's {key}, which holds {list(one)} per tensor")  # fmt: skip
    if built[key].dtype == _bfloat16() and tensor.dtype != _bfloat16():
        narrowed = _narrowed(tensor)
        if narrowed is None:
            inexact.add(key)
            return
        tensor = narrowed
    built[key][index] = tensor  # cast to the slot's dtype


def build_param(
    tables: Tables, reader: HFTensors, key: str, dtype: np.dtype, pool: Any
) -> np.ndarray:
    """MaxText parameter `key`, filled in place from its HF tensors in `dtype` (its
    `stored_dtypes` entry) by the `pool`'s threads, each reading, transforming and writing one
    HF tensor at a time; filled again in its own dtype where bfloat16 cannot hold it exactly."""
    jobs = list(_slot_jobs(tables, key))
    built = {key: np.empty(tables.params[key].shape, dtype)}
    inexact: set[str] = set()
    for _ in pool.map(functools.partial(_fill, tables, reader, built, inexact), jobs):
        pass
    if key in inexact:
        built[key] = np.empty(tables.params[key].shape, tables.params[key].dtype)
        for _ in pool.map(functools.partial(_fill, tables, reader, built, set()), jobs):
            pass
    return built[key]


def _nested(leaves: dict[str, Any]) -> dict[str, Any]:
    """{"params": tree} of `leaves` by MaxText key (its parts joined by "-")."""
    tree: dict[str, Any] = {}
    for key, leaf in leaves.items():
        *parents, name = key.split("-")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf
    return {"params": tree}


def import_hf(hf_dir: Path, argv: list[str], out: Path) -> None:
    """Write `hf_dir`'s weights as a params-only orbax checkpoint `out/0/items` (OCDBT), one
    parameter at a time: each is built in its final (numpy) buffer while orbax's partial save
    writes the one before, as it is. At most two parameters are held, never the model."""
    import jax
    from orbax.checkpoint import v1 as ocp

    from maxtext.common import checkpoint_context

    config = maxtext_config(argv)
    found = tables(config, read_config(hf_dir), saving_to_hf=False)
    reader = HFTensors(hf_dir, "numpy")
    unmapped = [k for k in found.params if k not in found.mapping]
    if unmapped:
        raise ConfigError(f"no HF tensor maps to MaxText's {', '.join(unmapped)}")
    log_rank_0(f"[maxtext] importing on JAX's {jax.default_backend()} backend")
    stored = stored_dtypes(found, reader)
    step, start, done = out / IMPORT_STEP, time.perf_counter(), 0
    # orbax's default deep copy of numpy arrays would hold a second copy of each parameter
    context = checkpoint_context.build_context(
        use_ocdbt=True, use_zarr3=config.checkpoint_storage_use_zarr3
    )
    context.memory.deepcopy_host_arrays = False
    context.memory.write_concurrent_bytes = WRITE_BYTES
    context.array.saving.storage_options.chunk_byte_size = CHUNK_BYTES
    # uncompressed: the 3B import saved 2.5-3 s sooner, its files 1.3x larger (random weights)
    context.array.saving.use_compression = False
    with context, ThreadPoolExecutor(THREADS) as pool:
        saving = None
        try:
            for i, key in enumerate(found.params, 1):
                built = time.perf_counter()
                leaf = build_param(found, reader, key, stored[key], pool)
                waited = time.perf_counter()
                if saving is not None:
                    saving.result()
                saving = ocp.partial.save_async(str(step), _nested({key: leaf}))
                done += leaf.nbytes
                log_rank_0(f"[maxtext] {i}/{len(found.params)} parameters, {done / 2**30:.2f} "
                           f"GiB, {time.perf_counter() - start:.1f} s: {key} ({leaf.nbytes / 2**30:.2f} "
                           f"GiB built in {waited - built:.1f} s, then "
                           f"{time.perf_counter() - waited:.1f} s waiting for the save before)")  # fmt: skip
                del leaf
        except BaseException:  # the save in flight ends before the caller removes the folder
            if saving is not None:
                with contextlib.suppress(Exception):
                    saving.result()
            raise
        if saving is not None:
            saving.result()
        ocp.partial.finalize(str(step))
    _name_items(step)
    log_rank_0(f"[maxtext] converted and saved {len(found.params)} parameters ({done / 2**30:.2f} "
               f"GiB) in {time.perf_counter() - start:.1f} s (peak RSS {peak_rss_gib():.2f} GiB)")  # fmt: skip


def _name_items(step: Path) -> None:
    """A finalized partial save holds its tree as checkpointable "state"; MaxText's
    `load_parameters_path` and a one-shot save (`checkpointable_name="items"`) name it "items":
    renamed, and recorded with the handler a one-shot save records."""
    from orbax.checkpoint import v1 as ocp

    (step / "state").rename(step / "items")
    metadata = step / "_CHECKPOINT_METADATA"
    record = json.loads(metadata.read_text())
    handler = ocp.handlers.PyTreeHandler
    record["item_handlers"] = {"items": f"{handler.__module__}.{handler.__qualname__}"}
    write_atomic(metadata, json.dumps(record))


def checkpoint_step(config: Any, iteration: int | None) -> Path:
    """The step folder of the run's orbax checkpoint: the latest, or `iteration`; while the
    run has none, the params-only checkpoint it starts from (`load_parameters_path`)."""
    folder = Path(config.checkpoint_dir)
    saved = numbered(folder, "") if folder.is_dir() else {}
    steps = {n: p for n, p in saved.items() if (p / "items").is_dir()}
    start = Path(config.load_parameters_path).parent if config.load_parameters_path else None
    if not steps and start is not None and start.is_dir() and iteration in (None, 0):
        return start
    if not steps:
        raise ConfigError(f"{folder}: no MaxText checkpoint to export",
                          hint="train with enable_checkpointing=true first")  # fmt: skip
    step = max(steps) if iteration is None else iteration
    if step not in steps:
        raise ConfigError(f"{folder}: no step {step}; saved: {sorted(steps)}")
    return steps[step]


def load_params(config: Any, params: dict[str, Any], step: Path) -> dict[str, Any]:
    """Parameters of an orbax step folder, by MaxText key: those of `params` (abstract
    leaves by MaxText key: the model's, or any of them), and only those are read."""
    from orbax.checkpoint import v1 as ocp

    from maxtext.common import checkpoint_context

    context = checkpoint_context.build_context(
        use_ocdbt=config.checkpoint_storage_use_ocdbt,
        use_zarr3=config.checkpoint_storage_use_zarr3,
        checkpoint_storage_concurrent_gb=config.checkpoint_storage_concurrent_gb,
        partial_load=True,  # a training checkpoint also holds the optimizer's state
    )
    with context:
        restored = ocp.load(str(step), _nested(params), checkpointable_name="items")["params"]
    return {key: functools.reduce(operator.getitem, key.split("-"), restored) for key in params}


def checkpoint_dtypes(step: Path, keys: Any) -> dict[str, np.dtype]:
    """The dtype each parameter (by MaxText key) has in an orbax step folder."""
    from orbax.checkpoint import v1 as ocp

    tree = ocp.metadata(str(step), checkpointable_name="items").metadata["params"]
    return {k: np.dtype(functools.reduce(operator.getitem, k.split("-"), tree).dtype) for k in keys}


def _names(names: Any) -> Iterator[str]:
    """The HF names of a (nested) mapping entry."""
    if isinstance(names, list):
        for sub in names:
            yield from _names(sub)
    elif names is not None:
        yield names


def export_dtype(config: Any, name: str | None) -> np.dtype:
    """The dtype an export writes: `name` (Primus's `export_dtype`), else the weights'."""
    return _bfloat16() if name == "bfloat16" else np.dtype(name or config.weight_dtype)


def export_layout(found: Tables, dtype: np.dtype) -> dict[str, tuple[list[int], str]]:
    """The HF tensors an export writes (name -> shape, safetensors dtype), in MaxText's
    parameter order."""
    code = FLOAT_CODES[dtype.name]
    return {
        name: (list(found.hf_shapes[name]), code)
        for key in found.params
        for name in _names(found.mapping[key])
    }


def _export_slot(found: Tables, dtype: np.dtype, weight: np.ndarray, writer: SafetensorsWriter,
                 job: tuple[str, Any, str, tuple[int, ...]]) -> None:  # fmt: skip
    """One HF tensor of a MaxText parameter: its slot, through MaxText's hooks (as
    `process_maxtext_param` does, in numpy, in the checkpoint's dtype), cast to `dtype`,
    written."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    key, index, name, _ = job
    shape = found.hf_shapes[name]
    tensor = np.asarray(apply_hook_fns(weight[index], shape, found.hooks.get(key)))
    writer.write(name, _cast(tensor, dtype).reshape(shape))


def export_hf(args: MaxTextArgs, iteration: int | None, out: Path) -> None:
    """The run's checkpoint (params only) as HF safetensors and config.json in `out`, with
    the tokenizer's files when `tokenizer_path` is a folder (an HF tokenizer). One MaxText
    parameter is written (its HF tensors by THREADS threads) while the next is read into host
    memory: at most two are held."""
    import jax
    from transformers import AutoConfig

    config = maxtext_config(args.argv)
    dtype = export_dtype(config, args.primus.get("export_dtype"))
    values = hf_config_from_maxtext(config, args.primus.get("rope_scaling_factor"), dtype)
    hf = AutoConfig.for_model(values.pop("model_type"), **values)
    found = tables(config, hf.to_dict(), saving_to_hf=True)
    step = checkpoint_step(config, iteration)
    writer = SafetensorsWriter(out, export_layout(found, dtype))
    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    # a parameter stored in the export's dtype (a bf16 import) is read and converted as it is:
    # MaxText's hooks only move, reshape or scale by powers of two what bf16 holds exactly
    stored = checkpoint_dtypes(step, found.params)

    def read(key: str) -> np.ndarray:
        leaf = found.params[key]
        kept = dtype if stored[key] == dtype else leaf.dtype
        on_host = jax.ShapeDtypeStruct(leaf.shape, kept, sharding=host)
        return np.asarray(load_params(config, {key: on_host}, step)[key])

    log_rank_0(f"[maxtext] exporting on JAX's {jax.default_backend()} backend")
    start = time.perf_counter()
    keys = list(found.params)
    with ThreadPoolExecutor(1) as reader, ThreadPoolExecutor(THREADS) as pool:
        coming = reader.submit(read, keys[0])
        for i, key in enumerate(keys):
            weight = coming.result()
            if i + 1 < len(keys):
                coming = reader.submit(read, keys[i + 1])
            export = functools.partial(_export_slot, found, dtype, weight, writer)
            for _ in pool.map(export, _slot_jobs(found, key)):
                pass
            del weight
    writer.close()
    log_rank_0(f"[maxtext] wrote {len(keys)} parameters from {step} as HF tensors in "
               f"{time.perf_counter() - start:.1f} s (peak RSS {peak_rss_gib():.2f} GiB)")  # fmt: skip
    hf.architectures = [type(hf).__name__.removesuffix("Config") + "ForCausalLM"]
    hf.save_pretrained(out)
    tokenizer = Path(config.tokenizer_path) if config.tokenizer_path else None
    if tokenizer is not None and tokenizer.is_dir():  # an HF tokenizer folder
        copy_tokenizer(tokenizer, out)
