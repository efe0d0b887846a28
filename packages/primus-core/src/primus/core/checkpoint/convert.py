"""HF checkpoints into and out of a run: `init_from`, `primus checkpoint import|export`.

Core owns what is the same for every backend: the architecture check against the experiment,
staging folders renamed into place only when complete (nothing half-written is ever left),
provenance, the hand-off between ranks, and what an export carries over from the HF model the
checkpoint came from (`export`), a LoRA run's PEFT adapter (`peft_adapter`). The backend's
`import_hf`/`export_hf`/`lora_adapters` hooks only convert tensors.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.core.checkpoint.export import HFSource, carry_over, choose_dtype, find_source
from primus.core.checkpoint.hf import read_config, weights_dtype
from primus.core.checkpoint.peft_adapter import write_adapter
from primus.core.checkpoint.preset import flatten, preset_from_hf, same_value
from primus.core.checkpoint.provenance import PROVENANCE_FILE, write_provenance
from primus.core.config.schema_cache import schema_of
from primus.core.errors import ConfigError
from primus.core.logging import get_logger
from primus.core.reliability.atomic import check_replaceable, staged_folder

if TYPE_CHECKING:
    from primus.core.backend.backend_adapter import BackendAdapter
    from primus.core.config.experiment import Experiment, ModuleConfig

_MISSING = object()
IMPORT_WAIT_S = 6 * 3600  # how long other ranks wait for rank 0's import


def architecture_mismatches(
    adapter: BackendAdapter, module: ModuleConfig, hf_dir: Path
) -> list[str]:
    """One line per architecture key where the HF config and the experiment differ: the key,
    both values, and where the experiment's value was set."""
    preset = preset_from_hf(adapter, hf_dir, read_config(hf_dir))
    schema = schema_of(adapter)
    params = dict(flatten(module.params))
    lines = []
    for key, hf_value in flatten(preset):
        if key in adapter.hf_preset_training_keys:
            continue
        value = params.get(key, _MISSING)
        if value is _MISSING:
            spec = schema.specs.get(key) if schema else None
            value = spec.default if spec else None
            where = "backend default"
        else:
            where = str(module.origin(key) or "set by a patch")
        if not same_value(hf_value, value):
            lines.append(f"{key}: {hf_value!r} in the HF config, {value!r} in the experiment "
                         f"({where})")  # fmt: skip
    return lines


def check_architecture(adapter: BackendAdapter, module: ModuleConfig, hf_dir: Path) -> None:
    """A ConfigError (at `init_from`) naming every architecture field that differs."""
    lines = architecture_mismatches(adapter, module, hf_dir)
    if lines:
        raise ConfigError(
            f"{hf_dir}/config.json does not match the experiment's model:\n  " + "\n  ".join(lines),
            module.init_from_origin,
            hint="derive the model preset from it: primus checkpoint preset --hf "
            f"{hf_dir} --framework {module.framework}",
        )


def import_dir(adapter: BackendAdapter, backend_args: Any) -> Path:
    folder = adapter.hf_import_dir(backend_args)
    if folder is None:
        raise ConfigError(f"the {adapter.framework} backend cannot import HF checkpoints")
    return Path(folder)


def import_hf(
    adapter: BackendAdapter, experiment: Experiment, module: ModuleConfig, backend_args: Any,
    hf_dir: Path,
) -> Path:  # fmt: skip
    """Convert `hf_dir` into the run's import folder (its architecture already checked, by
    `resolution.check_init_from`); the folder written."""
    final = import_dir(adapter, backend_args)
    if final.exists() and any(final.iterdir()):
        raise ConfigError(
            f"{final} already holds a checkpoint",
            hint="remove it, or import into another run (exp_name=...)",
        )
    start = time.perf_counter()
    get_logger().info(f"importing {hf_dir} into {final}")
    with staged_folder(final) as staging:
        adapter.import_hf(hf_dir, backend_args, staging)
        write_provenance(staging / PROVENANCE_FILE, experiment, module, hf_dir)
    get_logger().info(f"imported {hf_dir} in {time.perf_counter() - start:.1f} s: {final}")
    return final


def init_from_hf(
    adapter: BackendAdapter, experiment: Experiment, module: ModuleConfig, backend_args: Any,
    rank: int,
) -> None:  # fmt: skip
    """`init_from: {hf: DIR}` at the start of a run: import once (rank 0) unless the run's
    import folder is already there (a resumed run keeps its own checkpoints); other ranks wait
    for the folder to appear."""
    assert module.init_from is not None
    final = import_dir(adapter, backend_args)
    if final.exists():
        get_logger().info(f"init_from: {final} is there already; not importing again")
        return
    if rank == 0:
        import_hf(adapter, experiment, module, backend_args, module.init_from)
        return
    deadline = time.monotonic() + IMPORT_WAIT_S
    while not final.exists():
        if time.monotonic() > deadline:
            raise ConfigError(f"rank {rank}: rank 0 did not import {module.init_from} in time")
        time.sleep(1)


def _writable(out: Path, force: bool, run_dir: Path, source: HFSource | None) -> None:
    """`out` may be written (`check_replaceable`), and is neither the run directory, a folder
    around it nor a non-empty one inside it, nor the HF model the run started from, around or
    inside it. Nothing is removed here."""
    target, run = out.resolve(), run_dir.resolve()
    filled = out.is_dir() and any(out.iterdir())
    model = source.folder.resolve() if source and source.folder else None
    around_run = target == run or target in run.parents
    in_model = model is not None and (target == model or model in target.parents
                                      or target in model.parents)  # fmt: skip
    clash = run if around_run or (filled and run in target.parents) else model if in_model else None
    if clash is not None:
        raise ConfigError(f"{out} would overwrite {clash}", hint="export to another folder")
    check_replaceable(out, force)


def export_hf(
    adapter: BackendAdapter, experiment: Experiment, module: ModuleConfig, backend_args: Any,
    iteration: int | None, out: Path, force: bool = False,
) -> Path:  # fmt: skip
    """Write the run's checkpoint (latest, or `iteration`) as an HF directory at `out`: in
    the export dtype the experiment sets, else in that of the HF model it came from, with
    what the backend cannot derive carried over from that model (`export.carry_over`)."""
    start = time.perf_counter()
    source = find_source(adapter, module, backend_args)
    _writable(out, force, experiment.run_dir, source)
    dtype, why = choose_dtype(adapter, module, source)
    with staged_folder(out, replace=force) as staging:
        adapter.export_hf(backend_args, iteration, staging, dtype)
        if source is not None:
            carry_over(adapter, staging, source)
        weights = source.record if source else None
        write_provenance(staging / PROVENANCE_FILE, experiment, module, None, weights)
        written = weights_dtype(staging)
    get_logger().info(f"exported to {out} in {time.perf_counter() - start:.1f} s, "
                      f"{written} tensors ({why})")  # fmt: skip
    return out


def export_adapter(
    adapter: BackendAdapter, experiment: Experiment, module: ModuleConfig, backend_args: Any,
    iteration: int | None, out: Path, force: bool = False,
) -> Path:  # fmt: skip
    """Write the LoRA adapters of the run's checkpoint (latest, or `iteration`) as a PEFT
    adapter folder at `out`, for the HF model the run started from (its `init_from`), in the
    dtype an HF export would write (float32 where that is the checkpoint's own). The module
    has a `peft:` section."""
    assert module.peft is not None
    source = find_source(adapter, module, backend_args)
    _writable(out, force, experiment.run_dir, source)
    dtype, why = choose_dtype(adapter, module, source)
    base = str(source.folder or source.name) if source else None
    with staged_folder(out, replace=force) as staging:
        factors = adapter.lora_adapters(backend_args, iteration)
        write_adapter(staging, factors, module.peft, base, dtype or "float32")
        write_provenance(staging / PROVENANCE_FILE, experiment, module, None,
                         source.record if source else None)  # fmt: skip
    get_logger().info(f"exported the LoRA adapters of {len(factors)} linears to {out}, "
                      f"{dtype or 'float32'} ({why}), for base model {base or 'unknown'}")  # fmt: skip
    return out
