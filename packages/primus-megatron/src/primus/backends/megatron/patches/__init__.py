"""The megatron backend's patches. Importing this package registers them (entry point
`primus.patches`); megatron and torch are imported only inside the handlers."""

from primus.backends.megatron.patches import (
    data,
    devices,
    fallbacks,
    faults,
    nonfinite,
    posttrain,
    preemption,
    run_dir,
    throughput,
)

__all__ = [
    "data",
    "devices",
    "fallbacks",
    "faults",
    "nonfinite",
    "posttrain",
    "preemption",
    "run_dir",
    "throughput",
]
