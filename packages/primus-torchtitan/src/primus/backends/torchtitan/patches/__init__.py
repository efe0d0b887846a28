"""The torchtitan backend's patches. Importing this package registers them (entry point
`primus.patches`); torchtitan and torch are imported only inside the handlers."""

from primus.backends.torchtitan.patches import (
    checkpoints,
    data,
    devices,
    disk_full,
    log_routing,
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
    "log_routing",
    "nonfinite",
    "posttrain",
    "preemption",
    "run_dir",
    "throughput",
]
