"""MaxText's checks of a launch (its mesh, and the rows a step trains on, which MaxText computes
as int(per_device_batch_size x devices) and, at 0, trains on silently) and of what `peft:` on
MaxText cannot do."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.config.mesh import check_mesh, ici_axes
from primus.core.config import ModuleConfig, ParamSchema
from primus.core.errors import ConfigError, Origin

HOST_DEVICES = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def no_rows(per_device: float, devices: int, where: Origin | None = None) -> ConfigError | None:
    """The error for a step of no row (`per_device` rows on each of `devices`), or None."""
    if int(per_device * devices) >= 1:
        return None
    return ConfigError(
        f"per_device_batch_size {per_device} on {devices} device{'s' * (devices != 1)} trains "
        f"on no row a step (MaxText rounds {per_device} x {devices} down to 0)",
        where,
        hint=f"set per_device_batch_size to at least {1 / devices:g}",
    )


def param_values(config: ModuleConfig, schema: ParamSchema) -> Callable[[str], Any]:
    """A MaxText param's value, or its default in `schema` where unset."""
    return lambda key: config.params.get(key, schema.specs[key].default)


def cpu_devices() -> int:
    """A JAX process's CPU devices, as JAX counts them: JAX_NUM_CPU_DEVICES where set, else the
    count `XLA_FLAGS=--xla_force_host_platform_device_count=N` forces, else 1."""
    named = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    if named.isdigit() and int(named) > 0:
        return int(named)
    forced = HOST_DEVICES.search(os.environ.get("XLA_FLAGS", ""))
    return int(forced.group(1)) if forced else 1


def check_launch(config: ModuleConfig, schema: ParamSchema, processes: int) -> None:
    """On CPU, where each process holds one device (or the count `cpu_devices` reads), the ICI
    mesh fits the devices of the one slice and a step trains on at least one row; a GPU
    process's devices are known only where it runs (the trainer checks them)."""
    if config.params.get("hardware") != "cpu":
        return
    each = cpu_devices()
    value = param_values(config, schema)
    axes = ici_axes(value, schema)
    if axes is not None and value("num_slices") in (-1, 1):
        how = f"{processes} process{'es' * (processes != 1)} x {each} CPU device{'s' * (each != 1)}"
        check_mesh(config, axes, processes * each, how)
    error = no_rows(
        value("per_device_batch_size"), processes * each, config.origin("per_device_batch_size")
    )
    if error is not None:
        raise error


def check_peft(config: Any, value: Any) -> None:
    """What `peft:` on MaxText cannot do, refused at its line (`config`: the ModuleConfig,
    `value(key)`: a MaxText param or its default)."""
    peft = config.peft
    if peft is None:
        return
    if peft.dropout:
        raise peft.error(
            "dropout", "maxtext: qwix's LoRA drops the adapters' inputs in eval too",
            hint="set peft.dropout: 0 (Megatron and TorchTitan take a dropout)",
        )  # fmt: skip
    if value("gradient_accumulation_steps") > 1:
        raise config.error(
            "gradient_accumulation_steps",
            "maxtext: gradient accumulation differentiates every weight, not LoRA's alone",
            hint="set gradient_accumulation_steps: 1 (raise per_device_batch_size instead)",
        )


def check_eval(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """An eval of eval_steps -1 reads the eval set to its end, and synthetic data has none: the
    first eval never ended (post-training evaluates its own eval split)."""
    if config.sft is not None or value("dataset_type") != "synthetic":
        return
    if value("eval_interval") > 0 and value("eval_steps") <= 0:
        raise config.error(
            "eval_steps" if config.origin("eval_steps") else "eval_interval",
            f"eval_interval {value('eval_interval')} evaluates eval_steps "
            f"{value('eval_steps')} batches (the whole eval set) every {value('eval_interval')} "
            "steps, and synthetic data never ends: the first eval would never end",
            hint="set eval_steps to a positive number of batches, or eval_interval: -1",
        )


def check_uploads(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """gcs_metrics where the run's output is not on GCS: MaxText failed on the first upload
    (no credentials, or no bucket), log_period steps into the run. (An HLO dump stays in the
    run directory: patch maxtext.hlo_dump_kept.)"""
    output = str(value("base_output_directory") or "")
    if value("gcs_metrics") is True and not output.startswith("gs://"):
        where = output or "the run directory"
        raise config.error(
            "gcs_metrics",
            "gcs_metrics: MaxText uploads the metrics to Google Cloud Storage every log_period "
            f"steps, and base_output_directory is not a gs:// folder ({where})",
            hint="set gcs_metrics: false (the metrics are in the run directory's "
            "metrics.jsonl), or base_output_directory to a gs:// folder",
        )
