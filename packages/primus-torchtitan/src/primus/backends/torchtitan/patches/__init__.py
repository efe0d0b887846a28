"""The torchtitan backend's patches. Importing this package registers them (entry point
`primus.patches`); torchtitan and torch are imported only inside the handlers."""

from primus.backends.torchtitan.patches import (
    data,
    devices,
    log_routing,
    posttrain,
    run_dir,
    throughput,
)

__all__ = ["data", "devices", "log_routing", "posttrain", "run_dir", "throughput"]
