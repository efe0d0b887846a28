"""Step metrics in Primus's format: loss, tokens/s/GPU, TFLOP/s/GPU, MFU, peak memory.

FLOPs per step are MaxText's own count (`calculate_tflops_training_per_device`: weights
forward and backward plus attention, the causal attention term halved as Megatron-LM counts it).
See primus.core.metrics for the formulas.
"""

from __future__ import annotations

from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.metrics import MetricsSink, StepMetrics, metrics_enabled, step_metrics
from primus.core.patches import PatchContext, register_patch
from primus.core.posttrain import TokenStats


class StepMeter:
    """Turns the scalars MaxText's MetricLogger writes for a train step into Primus's metrics."""

    def __init__(self, ctx: PatchContext) -> None:
        self.sink = MetricsSink(ctx)

    def measure(
        self, config: Any, step: int, scalars: dict[str, Any], evals: dict[str, float]
    ) -> StepMetrics | None:
        """None while the batch size ramps up (MaxText reports no throughput then). `evals`:
        the eval that followed the step (`eval_stats`), if any."""
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
            self.sink.peak(device.device_kind if on_gpu else None),
            lr=float(scalars["learning/current_learning_rate"]),
            peak_memory_gib=memory["peak_bytes_in_use"] / 2**30 if memory else None,
            **evals,
        )

    def report(self, metric_logger: Any, metrics: StepMetrics) -> None:
        import jax

        writer = metric_logger.writer if metric_logger.config.enable_tensorboard else None
        self.sink.report(metrics, primary=jax.process_index() == 0, writer=writer)


def eval_stats(metric_logger: Any) -> dict[str, float]:
    """eval_loss and eval_token_accuracy of the eval MaxText ran after the step being
    written, when a fine-tune's eval step (primus.backends.maxtext.posttrain.sft) counted its
    correct predictions; MaxText writes the step before it closes that eval."""
    sums = metric_logger.cumulative_eval_metrics["scalar"]
    if not metric_logger._pending_eval_step_count or "eval/primus_correct" not in sums:
        return {}
    stats = TokenStats(
        sums["eval/total_loss"], sums["eval/primus_correct"], sums["eval/total_weights"]
    )
    return stats.as_metrics("eval_")


@register_patch(
    "maxtext.step_metrics",
    backend="maxtext",
    phase="before_train",
    condition=metrics_enabled,
    backend_versions=TESTED,
    target="maxtext.common.metric_logger.MetricLogger.write_metrics",
    tags=("observability",),
)
def step_metrics_patch(ctx: PatchContext) -> None:
    """Log loss, tokens/s/GPU, TFLOP/s/GPU, MFU and peak memory after every training step
    (and a fine-tune's eval loss and token accuracy after the steps it evaluates); write
    metrics.jsonl and tensorboard scalars (when tensorboard is on)."""

    def metered(original: Any) -> Any:
        meter = StepMeter(ctx)

        def write_metrics(self: Any, metrics: Any, step: int, metric_type: str = "train") -> None:
            original(self, metrics, step, metric_type)
            if metric_type == "train" and metrics:
                measured = meter.measure(self.config, step, metrics["scalar"], eval_stats(self))
                if measured is not None:
                    meter.report(self, measured)

        return write_metrics

    ctx.wrap("maxtext.common.metric_logger.MetricLogger", "write_metrics", metered)
