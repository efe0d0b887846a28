"""MaxText's checks of a launch: the rows a step trains on, which MaxText computes as
int(per_device_batch_size x devices) and, at 0, trains on silently."""

from __future__ import annotations

import os
import re

from primus.core.config import ModuleConfig
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


def check_launch(config: ModuleConfig, per_device: float, processes: int) -> None:
    """On CPU, where each process holds one device (or the count XLA_FLAGS forces), the step
    trains on at least one row; a GPU process's devices are known only where it runs (the
    trainer checks them)."""
    if config.params.get("hardware") != "cpu":
        return
    forced = HOST_DEVICES.search(os.environ.get("XLA_FLAGS", ""))
    error = no_rows(
        per_device,
        processes * (int(forced.group(1)) if forced else 1),
        config.origin("per_device_batch_size"),
    )
    if error is not None:
        raise error
