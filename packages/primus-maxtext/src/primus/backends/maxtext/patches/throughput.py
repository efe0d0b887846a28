"""Step metrics in Primus's format: loss, tokens/s/GPU, TFLOP/s/GPU, MFU, peak memory.

FLOPs per step are MaxText's own count (`calculate_tflops_training_per_device`: weights
forward and backward plus attention, the causal attention term halved as Megatron-LM counts it).
See primus.core.metrics for the formulas.
"""

from __future__ import annotations

from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.config import ParamSpec, register_params
from primus.core.logging import get_logger
from primus.core.metrics import StepMetrics, append_metrics, peak_tflops, step_metrics
from primus.core.patches import PatchContext, get_param, register_patch

register_params(
    "maxtext",
    {
        "log_step_metrics": ParamSpec(
            bool, "log tokens/s/GPU, TFLOP/s/GPU and MFU after every step (default true)"
        ),
        "peak_tflops": ParamSpec(float, "the GPU's dense bf16 peak for MFU (default: by name)"),
    },
)


class StepMeter:
    """Turns the scalars MaxText's MetricLogger writes for a train step into Primus's metrics."""

    def __init__(self, ctx: PatchContext) -> None:
        self.metrics_file = ctx.run_dir / "metrics.jsonl" if ctx.run_dir else None
        self.peak = get_param(ctx, "peak_tflops")

    def measure(self, config: Any, step: int, scalars: dict[str, Any]) -> StepMetrics | None:
        """None while the batch size ramps up (MaxText reports no throughput then)."""
        import jax

        if "perf/per_device_tflops" not in scalars:
            return None
        devices = jax.device_count()
        device = jax.local_devices()[0]
        on_gpu = device.platform == "gpu"
        memory = device.memory_stats() if on_gpu else None
        return step_metrics(
            step + 1,  # MaxText counts steps from 0
            config.steps,
            float(scalars["learning/loss"]),
            float(scalars["perf/step_time_seconds"]),
            round(float(scalars["perf/per_device_tokens"]) * devices),
            float(scalars["perf/per_device_tflops"]) * 1e12 * devices,
            devices,
            self.peak or (peak_tflops(device.device_kind) if on_gpu else None),
            lr=float(scalars["learning/current_learning_rate"]),
            peak_memory_gib=memory["peak_bytes_in_use"] / 2**30 if memory else None,
        )

    def report(self, metric_logger: Any, metrics: StepMetrics) -> None:
        import jax

        get_logger("maxtext").info(metrics.line())
        if jax.process_index() != 0:
            return
        if self.metrics_file:
            append_metrics(self.metrics_file, metrics)
        if metric_logger.config.enable_tensorboard:
            for name, value in metrics.scalars().items():
                metric_logger.writer.add_scalar(name, value, metrics.step)


def _wanted(ctx: PatchContext) -> bool:
    """log_step_metrics is true (default true)"""
    return bool(get_param(ctx, "log_step_metrics", True))


@register_patch(
    "maxtext.step_metrics",
    backend="maxtext",
    phase="before_train",
    condition=_wanted,
    backend_versions=TESTED,
    target="maxtext.common.metric_logger.MetricLogger.write_metrics",
    tags=("observability",),
)
def step_metrics_patch(ctx: PatchContext) -> None:
    """Log loss, tokens/s/GPU, TFLOP/s/GPU, MFU and peak memory after every training step;
    write metrics.jsonl and tensorboard scalars (when tensorboard is on)."""
    from maxtext.common.metric_logger import MetricLogger

    original = getattr(MetricLogger.write_metrics, "primus_original", MetricLogger.write_metrics)
    meter = StepMeter(ctx)

    def write_metrics(self: Any, metrics: Any, step: int, metric_type: str = "train") -> None:
        original(self, metrics, step, metric_type)
        if metric_type == "train" and metrics:
            measured = meter.measure(self.config, step, metrics["scalar"])
            if measured is not None:
                meter.report(self, measured)

    write_metrics.primus_original = original  # type: ignore[attr-defined]
    MetricLogger.write_metrics = write_metrics
