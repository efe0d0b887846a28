"""The maxtext backend's patches. Importing this package registers them (entry point
`primus.patches`); maxtext and JAX are imported only inside the handlers."""

from primus.backends.maxtext.patches import (
    absl_flags,
    config_errors,
    cudnn_attention,
    data_position,
    devices,
    gpu_attention_sharding,
    log_routing,
    nonfinite,
    posttrain,
    preemption,
    rope,
    run_dir,
    throughput,
    tied_logits,
)

__all__ = [
    "absl_flags",
    "config_errors",
    "cudnn_attention",
    "data_position",
    "devices",
    "gpu_attention_sharding",
    "log_routing",
    "nonfinite",
    "posttrain",
    "preemption",
    "rope",
    "run_dir",
    "throughput",
    "tied_logits",
]
