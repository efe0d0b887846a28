"""Hugging Face model directories into and out of Megatron distributed (torch_dist) checkpoints.

The mapping is hf_mapping's (megatron-bridge is not used: see docs/checkpoints.md). Megatron
stores global, unsharded tensors (each layer a chunk of a tensor with a leading layer axis),
so neither direction builds the model: import reads the HF safetensors one tensor at a time
and saves iteration 0 with `megatron.core.dist_checkpointing` (loadable at any TP/PP/EP:
Megatron reshards on load); export reads one Megatron tensor at a time from a checkpoint of
any parallel layout and writes it as one safetensors file.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from primus.backends.megatron.checkpoint.hf_mapping import (
    Layout,
    Param,
    extra_state_keys,
    hf_config,
    padded_vocab_size,
    params,
    rank_offsets,
    to_hf,
    to_megatron,
)
from primus.backends.megatron.checkpoint.native import TRACKER, iteration_dir
from primus.backends.megatron.posttrain import lora
from primus.core.checkpoint.export import copy_tokenizer
from primus.core.checkpoint.hf_tensors import HFTensors, SafetensorsWriter
from primus.core.errors import ConfigError
from primus.core.reliability.atomic import write_atomic, write_json

CHECKPOINT_VERSION = 3.0  # what megatron.training writes
# The model's part of the content metadata megatron.training saves (sharded_state_dict layout).
CONTENT_METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}


# -- import ----------------------------------------------------------------------------


@contextmanager
def _one_process_group() -> Iterator[None]:
    """A one-process gloo group (no network) for dist_checkpointing, unless one exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group(backend="gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _save_strategy() -> Any:
    """torch_dist with a writer thread per core (up to 8): one per output file."""
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    threads = min(8, os.cpu_count() or 1)
    return TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=threads)


def import_hf(hf_dir: Path, args: Any, out: Path) -> None:
    """Write the HF model in `hf_dir` into `out` as Megatron's iteration 0 (model only)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    layout = Layout.from_args(args, padded_vocab_size(args))
    source = HFTensors(hf_dir, "pt")
    source.check_unread(n for p in params(layout) for i in p.indices(layout) for n in p.names(i))
    state: dict[str, Any] = {}
    for param in params(layout):
        for index in param.indices(layout):
            hf = [source.get(n, s) for n, s in zip(param.names(index), param.shapes, strict=True)]
            state[f"{param.key}{index}"] = ShardedTensor.from_rank_offsets(
                param.key, to_megatron(param, hf, layout), *rank_offsets(index, layout),
                replica_id=0, prepend_axis_num=len(index),
            )  # fmt: skip
    for key, scope in extra_state_keys(layout):
        for index in Param(key, (), (), scope).indices(layout):
            counts = (layout.num_layers, layout.experts)[: len(index)]
            state[f"{key}{index}"] = ShardedObject(key, None, counts, index, replica_id=0)
    saved_args = copy.copy(args)
    saved_args.padded_vocab_size = layout.padded_vocab
    saved_args.consumed_train_samples = saved_args.consumed_valid_samples = 0
    state |= {"args": saved_args, "checkpoint_version": CHECKPOINT_VERSION, "iteration": 0}
    folder = out / "iter_0000000"
    folder.mkdir()
    with _one_process_group():
        dist_checkpointing.save(state, str(folder), _save_strategy(),
                                content_metadata=dict(CONTENT_METADATA))  # fmt: skip
    write_atomic(out / TRACKER, "0")


# -- export ----------------------------------------------------------------------------
def _read(reader: Any, stored: dict[str, Any], key: str) -> torch.Tensor:
    """One whole (unsharded) tensor of a checkpoint, read in this process."""
    import torch.distributed.checkpoint as dcp

    meta = stored[key]
    whole = {key: torch.empty(meta.size, dtype=meta.properties.dtype)}
    dcp.load(whole, storage_reader=reader, no_dist=True)
    return whole[key]


def _checkpoints(args: Any) -> Path:
    """The run's checkpoint folder (Megatron's `load`, else `save`)."""
    folder = args.load or args.save
    if not folder:
        raise ConfigError("the run has no checkpoint folder (its config sets neither load nor save)",
                          hint="train with save (and save_interval) set, then export")  # fmt: skip
    return Path(folder)


def lora_adapters(args: Any, iteration: int | None) -> dict[str, Any]:
    """The LoRA adapters of the run's checkpoint (latest, or `iteration`) as (A, B) per HF
    module (`lora.hf_factors`)."""
    import torch.distributed.checkpoint as dcp

    folder = iteration_dir(_checkpoints(args), iteration)
    reader = dcp.FileSystemReader(str(folder))
    stored: dict[str, Any] = reader.read_metadata().state_dict_metadata
    adapters = {k: _read(reader, stored, k) for k in stored if lora.ADAPTER in k}
    if not adapters:
        raise ConfigError(f"{folder}: holds no LoRA adapters",
                          hint="export a checkpoint the LoRA run saved (iteration 0 is the HF "
                          "import)")  # fmt: skip
    return lora.hf_factors(adapters)


def export_hf(args: Any, iteration: int | None, out: Path, dtype_name: str | None) -> None:
    """Write the run's checkpoint (latest, or `iteration`) as an HF directory in `out`, in
    `dtype_name` (None: the checkpoint's dtype), read from the checkpoint alone one Megatron
    tensor (all its layers) at a time. A LoRA checkpoint (adapters only) is merged into the
    run's HF import (iteration 0)."""
    import torch.distributed.checkpoint as dcp

    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    folder = iteration_dir(_checkpoints(args), iteration)
    saved = load_common_state_dict(str(folder))["args"]
    layout = Layout.from_args(saved, saved.padded_vocab_size)
    reader = dcp.FileSystemReader(str(folder))
    stored: dict[str, Any] = reader.read_metadata().state_dict_metadata
    adapters = {k: _read(reader, stored, k) for k in stored if lora.ADAPTER in k}
    if adapters:  # the frozen weights are the HF import's
        base = iteration_dir(folder.parent, 0)
        reader = dcp.FileSystemReader(str(base))
        stored = reader.read_metadata().state_dict_metadata
    table = params(layout)
    missing = [p.key for p in table if p.key not in stored]
    if missing:
        raise ConfigError(f"{folder}: no tensor '{missing[0]}' (not a model Primus converts)")
    dtype = getattr(torch, dtype_name) if dtype_name else stored[table[0].key].properties.dtype
    code = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]
    layout_out = {
        name: (list(shape), code)
        for param in table
        for index in param.indices(layout)
        for name, shape in zip(param.names(index), param.shapes, strict=True)
    }
    writer = SafetensorsWriter(out, layout_out)
    for param in table:
        whole = _read(reader, stored, param.key)
        for index in param.indices(layout):
            names = param.names(index)
            hf = to_hf(param, whole[index], layout)
            if adapters and param.scope == "layer":
                hf = [lora.merge(n, t, adapters, index[0], saved.primus_peft.scaling)
                      for n, t in zip(names, hf, strict=True)]  # fmt: skip
            for name, tensor in zip(names, hf, strict=True):
                writer.write(name, tensor.to(dtype))
        del whole
    writer.close()
    config = hf_config(layout, saved, dtype)
    write_json(out / "config.json", config)
    tokenizer = Path(saved.tokenizer_model or "")
    if saved.tokenizer_type == "HuggingFaceTokenizer" and tokenizer.is_dir():
        copy_tokenizer(tokenizer, out)
