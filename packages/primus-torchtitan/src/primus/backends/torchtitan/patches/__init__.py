"""The torchtitan backend's patches, registered on import (entry point `primus.patches`).

Each feature folder holds its own patches; this list imports them in the order they register
(patches of one phase and priority run in that order). TorchTitan and torch are imported only
inside the handlers."""

from importlib import import_module

MODULES = (
    "primus.backends.torchtitan.checkpoint.patches",
    "primus.backends.torchtitan.data.patches",
    "primus.backends.torchtitan.devices.patches",
    "primus.backends.torchtitan.reliability.disk_full",
    "primus.backends.torchtitan.observability.log_routing",
    "primus.backends.torchtitan.reliability.nonfinite",
    "primus.backends.torchtitan.posttrain.patches",
    "primus.backends.torchtitan.reliability.preemption",
    "primus.backends.torchtitan.observability.run_dir",
    "primus.backends.torchtitan.observability.throughput",
)

for _module in MODULES:
    import_module(_module)
