"""The megatron backend's patches. Importing this package registers them (entry point
`primus.patches`); megatron and torch are imported only inside the handlers."""

from primus.backends.megatron.patches import (
    checkpoints,
    data,
    devices,
    disk_full,
    fallbacks,
    nonfinite,
    posttrain,
    preemption,
    run_dir,
    throughput,
)

__all__ = [
    "checkpoints",
    "data",
    "devices",
    "disk_full",
    "fallbacks",
    "nonfinite",
    "posttrain",
    "preemption",
    "run_dir",
    "throughput",
]
