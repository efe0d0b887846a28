"""Step metrics in Primus's format: loss, tokens/s/GPU, TFLOP/s/GPU, MFU, peak memory.

FLOPs per token are TorchTitan's own count (`num_flops_per_token`: 6 x parameters plus the
attention term, forward and backward), and for DPO a third more (the reference's forward); a
DPO sample is a pair of rows. See primus.core.metrics for the formulas.
"""

from __future__ import annotations

import time
from typing import Any

from primus.core.metrics import MetricsSink, StepMetrics, metrics_enabled, step_metrics
from primus.core.patches import PatchContext, register_patch
from primus.core.posttrain.preference import REWARD_METRICS


class StepMeter:
    """Reads a MetricsProcessor's counters around its `log` and reports the steps since the last."""

    def __init__(self, ctx: PatchContext) -> None:
        self.training = ctx.backend_args.training
        self.sink = MetricsSink(ctx)
        self.pp_schedule = ctx.backend_args.parallelism.pipeline_parallel_schedule
        self.pending: StepMetrics | None = None  # fine-tuning: a step line held for its eval
        module = ctx.extra.get("module")
        # DPO: a sample is a pair, two rows; each row also runs through the reference (a forward:
        # a third of TorchTitan's forward-and-backward count)
        self.dpo = module is not None and module.dpo is not None

    def measure(self, processor: Any, step: int, loss: float) -> StepMetrics | None:
        """Called just before the processor's own `log` resets its counters."""
        dims, training = processor.parallel_dims, self.training
        batch_degree = dims.world_size // dims.non_data_parallel_size
        global_batch = training.global_batch_size
        if global_batch <= 0:
            global_batch = training.local_batch_size * batch_degree
        tokens = global_batch * training.seq_len * (2 if self.dpo else 1)  # per step, all ranks
        # steps since the last log, from this rank's token count (right after a resume too)
        steps = round(processor.ntokens_since_last_log * batch_degree / tokens)
        if steps <= 0:
            return None
        seconds = (time.perf_counter() - processor.time_last_log) / steps
        monitor = processor.device_memory_monitor
        on_gpu = monitor.device.type != "cpu"
        peaks = monitor.get_peak_stats() if on_gpu else None
        return step_metrics(
            step,
            training.steps,
            float(loss),
            seconds,
            tokens,
            processor.num_flops_per_token * tokens * (4 / 3 if self.dpo else 1),
            dims.world_size,
            self.sink.peak(monitor.device_name if on_gpu else None),
            lr=_lr(processor),
            peak_memory_gib=peaks.max_active_gib if peaks else None,
            reserved_memory_gib=peaks.max_reserved_gib if peaks else None,
        )


class Scalars:
    """TorchTitan's metrics logger (tensorboard, wandb) as a `ScalarWriter`."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        self.logger.log({tag: scalar_value}, global_step)


def _lr(processor: Any) -> float | None:
    optimizers = getattr(processor, "optimizers", None)
    for optimizer in getattr(optimizers, "optimizers", ()):
        return float(optimizer.param_groups[0]["lr"])
    return None


def _from_loss_rank(dims: Any, pp_schedule: str, *losses: float) -> tuple[float, ...]:
    """The losses as the first rank of the last pipeline stage has them (TorchTitan's metrics
    rank; the other stages hold -1). V schedules end on rank 0, which has them already."""
    if not dims.pp_enabled or pp_schedule == "ZBVZeroBubble":
        return losses
    import torch
    import torch.distributed as dist

    device = "cpu" if dist.get_backend() == "gloo" else torch.accelerator.current_accelerator()
    values = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.broadcast(values, src=dims.world_size // dims.pp * (dims.pp - 1))
    return tuple(values.tolist())


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


@register_patch(
    "torchtitan.step_metrics",
    backend="torchtitan",
    phase="before_train",
    condition=metrics_enabled,
    target="torchtitan.components.metrics.MetricsProcessor.log, log_validation",
    tags=("observability",),
)
def step_metrics_patch(ctx: PatchContext) -> None:
    """Log loss, tokens/s/GPU, TFLOP/s/GPU, MFU and peak memory every metrics.log_freq steps;
    write metrics.jsonl and tensorboard scalars (when tensorboard is on). Under pipeline
    parallelism the loss comes from the last stage, so rank 0 logs it instead of -1.
    Fine-tuning: a step's eval loss and token accuracy go on its line; DPO's reward metrics
    and its eval's too."""
    meter = StepMeter(ctx)
    trainer = ctx.extra.get("trainer")
    validator: Any = getattr(getattr(trainer, "trainer", None), "validator", None)
    evaluates = ctx.stage == "posttrain" and validator is not None
    dpo: Any = getattr(trainer, "dpo", None)  # posttrain.dpo.DPOStep: the step's rewards

    def metered(original: Any) -> Any:
        def log(
            self: Any, step: int, avg_loss: float, max_loss: float, *args: Any, **kw: Any
        ) -> None:
            avg_loss, max_loss = _from_loss_rank(
                self.parallel_dims, meter.pp_schedule, avg_loss, max_loss
            )
            metrics = meter.measure(self, step, avg_loss)
            rewards = dpo.rewards() if dpo is not None else {}  # on every rank: a collective
            if metrics is not None:
                for name, value in rewards.items():
                    setattr(metrics, name, value)
            original(self, step, avg_loss, max_loss, *args, **kw)
            if metrics is not None and evaluates and validator.should_validate(step):
                meter.pending = metrics  # reported with the eval that follows the step
            elif metrics is not None:
                meter.sink.report(metrics, primary=_rank() == 0, writer=Scalars(self.logger))

        return log

    def with_eval(original: Any) -> Any:
        def log_validation(self: Any, loss: float, step: int, extra_metrics: Any = None) -> None:
            from primus.backends.torchtitan.posttrain.sft import ACCURACY, VALIDATION

            original(self, loss, step, extra_metrics)
            metrics, meter.pending = meter.pending, None
            if metrics is not None and metrics.step == step:
                extra = extra_metrics or {}
                metrics.eval_loss = float(loss)
                if ACCURACY in extra:
                    metrics.eval_token_accuracy = float(extra[ACCURACY])
                for name in REWARD_METRICS:  # DPO's eval
                    if VALIDATION + name in extra:
                        setattr(metrics, f"eval_{name}", float(extra[VALIDATION + name]))
                meter.sink.report(metrics, primary=_rank() == 0, writer=Scalars(self.logger))

        return log_validation

    processor = "torchtitan.components.metrics.MetricsProcessor"
    ctx.wrap(processor, "log", metered)
    if evaluates:
        ctx.wrap(processor, "log_validation", with_eval)
