"""Step metrics in Primus's format: loss, tokens/s/GPU, TFLOP/s/GPU, MFU, peak memory; with
`dpo:`, the reward metrics.

FLOPs per step are Megatron's own count (`num_floating_point_operations`: forward and
backward, causal attention counted as half the full score matrix); DPO counts both rows of
each pair, and the reference's forward. See primus.core.metrics.
"""

from __future__ import annotations

import time
from typing import Any

from primus.core.metrics import MetricsSink, metrics_enabled, step_metrics
from primus.core.patches import PatchContext, register_patch
from primus.core.posttrain.preference import REWARD_METRICS


class StepMeter:
    """Wraps megatron's `training_log`: times the steps between logs and reports them."""

    def __init__(self, ctx: PatchContext, original: Any) -> None:
        import torch

        from megatron.training import get_args, get_tensorboard_writer
        from megatron.training.training import num_floating_point_operations
        from megatron.training.utils import is_last_rank

        # looked up once here, not on every step
        self.megatron_args = get_args
        self.tensorboard = get_tensorboard_writer
        self.is_last_rank = is_last_rank
        self.flops = num_floating_point_operations
        self.max_memory = torch.cuda.max_memory_allocated
        self.max_reserved = torch.cuda.max_memory_reserved
        self.original = original
        self.sink = MetricsSink(ctx)
        self.on_gpu = torch.cuda.is_available() and torch.cuda.get_device_name() != "cpu"
        self.peak = self.sink.peak(torch.cuda.get_device_name() if self.on_gpu else None)
        self.last: tuple[int, float] | None = None
        self.posttrain = ctx.stage == "posttrain"
        self.pending: Any = None  # a step's metrics, held until the eval that follows it
        self.evaluated_at: int | None = None

    def __call__(
        self,
        loss_dict: dict[str, Any],
        total_loss_dict: Any,
        lr: Any,
        iteration: int,
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        result = self.original(loss_dict, total_loss_dict, lr, iteration, *rest, **kwargs)
        args = self.megatron_args()
        now = time.perf_counter()
        if self.last is None or iteration % args.log_interval:
            self.last = self.last or (iteration, now)
            return result
        steps, start = iteration - self.last[0], self.last[1]
        self.last = (iteration, now)
        if steps <= 0 or not self.is_last_rank():
            return result
        loss = loss_dict.get("lm loss")
        rows, passes = args.global_batch_size, 1.0
        if getattr(args, "primus_dpo", None) is not None:
            # two rows a pair; the reference's forward adds a third to forward and backward
            rows, passes = 2 * rows, 4 / 3
        rewards = {key: float(loss_dict[key]) for key in REWARD_METRICS if key in loss_dict}
        metrics = step_metrics(
            iteration,
            args.train_iters,
            float(loss) if loss is not None else None,
            (now - start) / steps,
            rows * args.seq_length,
            self.flops(args, rows) * passes,
            args.world_size,
            self.peak,
            lr=float(lr) if lr is not None else None,
            peak_memory_gib=self.max_memory() / 2**30 if self.on_gpu else None,
            reserved_memory_gib=self.max_reserved() / 2**30 if self.on_gpu else None,
            **rewards,
        )
        evaluates = args.do_valid and args.eval_interval and iteration % args.eval_interval == 0
        if self.posttrain and evaluates:
            self.pending = metrics  # reported with the eval's results (`evaluate`)
        else:
            self.sink.report(metrics, primary=True, writer=self.tensorboard())
        return result

    def evaluate(self, original: Any) -> Any:
        """Megatron's `evaluate`, its results added to the held step line (fine-tuning: `lm
        loss` and `token acc` as defined by primus.core.posttrain.metrics; DPO: `lm loss` and
        the reward metrics, as primus.core.posttrain.preference defines them)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if self.pending is not None and result[0]:
                evals = result[0]
                self.pending.eval_loss = float(evals["lm loss"])
                if "token acc" in evals:
                    self.pending.eval_token_accuracy = float(evals["token acc"])
                for key in REWARD_METRICS:
                    if key in evals:
                        setattr(self.pending, f"eval_{key}", float(evals[key]))
                self.sink.report(self.pending, primary=True, writer=self.tensorboard())
                self.pending = None
            return result

        return run

    def once_per_step(self, original: Any) -> Any:
        """Megatron's `evaluate_and_print_results`, skipped when it already ran at this
        iteration (the eval after training, when the last step evaluated)."""

        def run(prefix: str, step: Any, data: Any, model: Any, iteration: int, *rest: Any,
                **kwargs: Any) -> Any:  # fmt: skip
            if iteration == self.evaluated_at:
                return None
            self.evaluated_at = iteration
            return original(prefix, step, data, model, iteration, *rest, **kwargs)

        return run


@register_patch(
    "megatron.step_metrics",
    backend="megatron",
    phase="before_train",
    condition=metrics_enabled,
    target="megatron.training.training.training_log, evaluate, evaluate_and_print_results",
    tags=("observability",),
)
def step_metrics_patch(ctx: PatchContext) -> None:
    """Log loss, tokens/s/GPU, TFLOP/s/GPU and MFU every log_interval; write metrics.jsonl
    and tensorboard scalars. Fine-tuning: a step's eval loss and token accuracy (DPO: reward
    metrics) on its line."""
    meters: list[StepMeter] = []

    def meter(log: Any) -> StepMeter:
        meters.append(StepMeter(ctx, log))
        return meters[-1]

    training = "megatron.training.training"
    ctx.wrap(training, "training_log", meter)
    if ctx.stage == "posttrain":
        ctx.wrap(training, "evaluate", meters[-1].evaluate)
        ctx.wrap(training, "evaluate_and_print_results", meters[-1].once_per_step)
