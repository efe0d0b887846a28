"""MaxText's ICI mesh, checked without MaxText: the ici_*_parallelism sizes of its `mesh_axes`
(at most one -1, the devices the others leave) multiply to the devices of a slice, which
`maxtext.utils.maxtext_utils.create_device_mesh` asserts only once JAX has started."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from primus.core.config import ModuleConfig, ParamSchema
from primus.core.errors import ConfigError, Origin

AXIS_KEY = re.compile(r"(ici|dcn)_\w+_parallelism")  # an axis's size within, across slices
LAYOUT_KEY = re.compile(rf"{AXIS_KEY.pattern}|num_slices|mesh_axes|custom_mesh_and_rule")
_KEY_OF_AXIS = {"stage": "pipeline", "model": "tensor"}  # axes whose ici_* key is named otherwise

Axes = list[tuple[str, int]]  # (ici_* key, size) for each axis of the mesh


def ici_axes(value: Callable[[str], Any], schema: ParamSchema) -> Axes | None:
    """The mesh's ICI sizes (`value`: a param or MaxText's default), or None where MaxText lays
    the mesh out from more than these keys: a custom mesh and rule, an axis with no ici_* key."""
    names = value("mesh_axes")
    if value("custom_mesh_and_rule") or not isinstance(names, list):
        return None
    keys = [f"ici_{_KEY_OF_AXIS.get(axis, axis)}_parallelism" for axis in names]
    axes = [(key, value(key)) for key in keys if key in schema.specs]
    return axes if len(axes) == len(keys) and all(isinstance(s, int) for _, s in axes) else None


def _shown(axes: Axes) -> str:
    """The sizes other than 1, as `ici_fsdp_parallelism 2 x ici_tensor_parallelism -1`."""
    return " x ".join(f"{key} {size}" for key, size in axes if size != 1) or "every axis 1"


def _at_fault(config: ModuleConfig, axes: Axes) -> str | None:
    """The first ICI key set (in a file, a preset, an override) to a size above 1, else to -1."""
    ranked = sorted(axes, key=lambda axis: axis[1] == -1)
    return next((k for k, size in ranked if size != 1 and config.origin(k) is not None), None)


def check_unspecified(config: ModuleConfig, axes: Axes) -> None:
    """At most one ICI axis is -1 (MaxText cannot split the devices between two)."""
    unspecified = [key for key, size in axes if size == -1]
    if len(unspecified) > 1:
        key = next((k for k in reversed(unspecified) if config.origin(k) is not None), None)
        raise ConfigError(
            f"{' and '.join(unspecified)} are each -1 (the devices left): MaxText fills at most "
            "one ICI axis",
            config.origin(key) if key else None,
            hint=f"set {key or unspecified[-1]} to a size",
        )


def check_mesh(config: ModuleConfig, axes: Axes, devices: int, how: str) -> None:
    """The ICI sizes multiply to `devices` (a -1 taking what the others leave), or a
    ConfigError at the ICI key set that is at fault; `how` tells where the devices come from."""
    fixed = math.prod(size for _, size in axes if size != -1)
    unspecified = any(size == -1 for _, size in axes)
    if (devices % fixed == 0) if unspecified else fixed == devices:
        return
    spans = f"a multiple of {fixed}" if unspecified else str(fixed)
    key = _at_fault(config, axes)
    raise ConfigError(
        f"MaxText cannot lay out its mesh: the ICI parallelism ({_shown(axes)}) spans {spans} "
        f"device{'s' * (spans != '1')}, the launch has {devices} ({how})",
        config.origin(key) if key else None,
        hint=f"make the ici_*_parallelism keys multiply to {devices} (-1 takes the rest), or start "
        f"{spans} devices (--nproc-per-node; XLA_FLAGS=--xla_force_host_platform_device_count=N "
        "gives a CPU process N)",
    )


def mesh_origin(origins: dict[str, Origin], resolved: dict[str, Any]) -> Origin | None:
    """Where the first layout key set to other than 1 was set (`origins`: params' origins,
    `resolved`: MaxText's config), for an error of MaxText's own mesh building."""
    at = (o for key, o in origins.items() if LAYOUT_KEY.fullmatch(key) and resolved.get(key) != 1)
    return next(at, None)
