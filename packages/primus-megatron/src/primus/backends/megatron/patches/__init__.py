"""The megatron backend's patches, registered on import (entry point `primus.patches`).

Each feature folder holds its own patches; this list imports them in the order they register
(patches of one phase and priority run in that order). Megatron and torch are imported only
inside the handlers."""

from importlib import import_module

MODULES = (
    "primus.backends.megatron.checkpoint.patches",
    "primus.backends.megatron.data.patches",
    "primus.backends.megatron.devices.patches",
    "primus.backends.megatron.reliability.disk_full",
    "primus.backends.megatron.devices.fallbacks",
    "primus.backends.megatron.reliability.nonfinite",
    "primus.backends.megatron.posttrain.patches",
    "primus.backends.megatron.reliability.preemption",
    "primus.backends.megatron.observability.run_dir",
    "primus.backends.megatron.observability.throughput",
)

for _module in MODULES:
    import_module(_module)
