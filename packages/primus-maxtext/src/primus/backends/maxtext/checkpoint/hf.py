"""HF checkpoints into and out of MaxText, with MaxText's own conversion tables (hf_mapping).

Primus streams the tensors (one parameter built while the one before is saved, one read while
the one before is written) and writes the params-only orbax checkpoint MaxText's
`load_parameters_path` reads (`<import dir>/0/items`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from primus.backends.maxtext.checkpoint import lora
from primus.backends.maxtext.checkpoint.hf_mapping import (
    Tables,
    build_param,
    cast,
    export_dtype,
    export_layout,
    hf_config_from_maxtext,
    hf_names,
    maxtext_config,
    slot_jobs,
    stored_dtypes,
    tables,
)
from primus.backends.maxtext.checkpoint.native import IMPORT_FOLDER
from primus.backends.maxtext.checkpoint.orbax_params import load_params, nested
from primus.backends.maxtext.checkpoint.query_record import scaled_at_run_time, write_record
from primus.backends.maxtext.config.bridge import MaxTextArgs
from primus.core.checkpoint.dcp import numbered
from primus.core.checkpoint.export import copy_tokenizer
from primus.core.checkpoint.hf import read_config
from primus.core.checkpoint.hf_tensors import HFTensors, SafetensorsWriter
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.reliability.atomic import write_atomic

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


def import_hf(hf_dir: Path, argv: list[str], out: Path) -> None:
    """Write `hf_dir`'s weights as a params-only orbax checkpoint `out/0/items` (OCDBT), one
    parameter at a time: each is built in its final (numpy) buffer while orbax's partial save
    writes the one before, as it is. At most two parameters are held, never the model."""
    import jax
    from orbax.checkpoint import v1 as ocp

    from maxtext.common import checkpoint_context

    config = maxtext_config(argv)
    found = tables(config, read_config(hf_dir), saving_to_hf=False, query_at_run_time=True)
    reader = HFTensors(hf_dir, "numpy")
    unmapped = [k for k in found.params if k not in found.mapping]
    if unmapped:
        raise ConfigError(f"no HF tensor maps to MaxText's {', '.join(unmapped)}")
    reader.check_unread(n for key in found.params for n in hf_names(found.mapping[key]))
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
                saving = ocp.partial.save_async(str(step), nested({key: leaf}))
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
    write_record(out)
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
    saved = numbered(folder, "")
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


def checkpoint_dtypes(step: Path, keys: Any) -> dict[str, np.dtype]:
    """The dtype each parameter (by MaxText key) has in an orbax step folder."""
    from orbax.checkpoint import v1 as ocp

    tree = ocp.metadata(str(step), checkpointable_name="items").metadata["params"]
    return {k: np.dtype(functools.reduce(operator.getitem, k.split("-"), tree).dtype) for k in keys}


def _export_slot(found: Tables, dtype: np.dtype, weight: np.ndarray, writer: SafetensorsWriter,
                 job: tuple[str, Any, str, tuple[int, ...]]) -> None:  # fmt: skip
    """One HF tensor of a MaxText parameter: its slot, through MaxText's hooks (as
    `process_maxtext_param` does, in numpy, in the checkpoint's dtype), cast to `dtype`,
    written."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    key, index, name, _ = job
    shape = found.hf_shapes[name]
    tensor = np.asarray(apply_hook_fns(weight[index], shape, found.hooks.get(key)))
    writer.write(name, cast(tensor, dtype).reshape(shape))


def _export_tables(args: MaxTextArgs, dtype: str | None) -> tuple[Any, Any, Tables, np.dtype]:
    """(MaxText's config, the HF config, the conversion tables, the dtype written) of an
    export in `dtype` (None: weight_dtype)."""
    from transformers import AutoConfig

    config = maxtext_config(args.argv)
    written = export_dtype(config, dtype)
    values = hf_config_from_maxtext(config, args.primus.get("rope_scaling_factor"), written)
    hf = AutoConfig.for_model(values.pop("model_type"), **values)
    at_run_time = scaled_at_run_time(config)
    found = tables(config, hf.to_dict(), saving_to_hf=True, query_at_run_time=at_run_time)
    return config, hf, found, written


def lora_adapters(args: MaxTextArgs, iteration: int | None) -> dict[str, Any]:
    """The LoRA adapters of the run's checkpoint (latest, or `iteration`) as (A, B) per HF
    module name, in HF space (`checkpoint.lora.adapter_factors`)."""
    config, _, found, _ = _export_tables(args, None)
    step = checkpoint_step(config, iteration)
    if step == lora.base_step(config):
        raise ConfigError(f"{config.checkpoint_dir}: no LoRA checkpoint to export",
                          hint="train with enable_checkpointing=true first")  # fmt: skip
    return lora.adapter_factors(found, lora.read_adapters(config, step))


def export_hf(args: MaxTextArgs, iteration: int | None, out: Path, dtype: str | None) -> None:
    """The run's checkpoint (params only) as HF safetensors in `dtype` (None: weight_dtype)
    and config.json in `out`, with the tokenizer's files when `tokenizer_path` is a folder (an
    HF tokenizer). One MaxText parameter is written (its HF tensors by THREADS threads) while
    the next is read into host memory: at most two are held."""
    import jax

    config, hf, found, written = _export_tables(args, dtype)
    step = checkpoint_step(config, iteration)
    adapters, source = {}, step  # a LoRA run's frozen weights are its import's
    if lora.enabled(config) and step != lora.base_step(config):
        adapters, source = lora.read_adapters(config, step), lora.base_step(config)
    writer = SafetensorsWriter(out, export_layout(found, written))
    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    # a parameter stored in the export's dtype (a bf16 import) is read and converted as it is:
    # MaxText's hooks only move, reshape or scale (an import folded by MaxText's own query
    # scale, made before it moved to run time: exact where sqrt(head_dim) is a power of two)
    stored = checkpoint_dtypes(source, found.params)

    def read(key: str) -> np.ndarray:
        leaf = found.params[key]
        kept = written if stored[key] == written and key not in adapters else leaf.dtype
        on_host = jax.ShapeDtypeStruct(leaf.shape, kept, sharding=host)
        weight = np.asarray(load_params(config, {key: on_host}, source)[key])
        return lora.merged(found, key, weight, adapters)

    log_rank_0(f"[maxtext] exporting on JAX's {jax.default_backend()} backend")
    start = time.perf_counter()
    keys = list(found.params)
    with ThreadPoolExecutor(1) as reader, ThreadPoolExecutor(THREADS) as pool:
        coming = reader.submit(read, keys[0])
        for i, key in enumerate(keys):
            weight = coming.result()
            if i + 1 < len(keys):
                coming = reader.submit(read, keys[i + 1])
            export = functools.partial(_export_slot, found, written, weight, writer)
            for _ in pool.map(export, slot_jobs(found, key)):
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
