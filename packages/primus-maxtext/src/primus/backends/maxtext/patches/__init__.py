"""The maxtext backend's patches, registered on import (entry point `primus.patches`).

Each feature folder holds its own patches; this list imports them in the order they register
(patches of one phase and priority run in that order). MaxText and JAX are imported only inside
the handlers."""

from importlib import import_module

MODULES = (
    "primus.backends.maxtext.config.absl_flags",
    "primus.backends.maxtext.config.errors",
    "primus.backends.maxtext.devices.cudnn_attention",
    "primus.backends.maxtext.data.position",
    "primus.backends.maxtext.data.corpus",
    "primus.backends.maxtext.devices.patches",
    "primus.backends.maxtext.devices.gpu_attention_sharding",
    "primus.backends.maxtext.observability.log_routing",
    "primus.backends.maxtext.reliability.nonfinite",
    "primus.backends.maxtext.posttrain.patches",
    "primus.backends.maxtext.reliability.preemption",
    "primus.backends.maxtext.model.rope",
    "primus.backends.maxtext.observability.run_dir",
    "primus.backends.maxtext.observability.throughput",
    "primus.backends.maxtext.model.tied_logits",
    "primus.backends.maxtext.model.query_scale",
    "primus.backends.maxtext.checkpoint.patches",
)

for _module in MODULES:
    import_module(_module)
