"""Training metrics every backend reports the same way: the step line, metrics.jsonl, scalars.

A backend's patch reads its upstream's numbers into `step_metrics` and hands the result to a
`MetricsSink`; the params (`log_step_metrics`, `peak_tflops`) are registered here for every
backend, and `metrics_enabled` is the patch condition.

tokens/s/GPU = global batch tokens per step / step seconds / world size
TFLOP/s/GPU  = model FLOPs per step (forward + backward, the backend's count, which it
               names) / step seconds / world size / 1e12
MFU          = TFLOP/s/GPU / the GPU's dense bf16 peak: `peak_tflops`, else the rate
               `primus benchmark gemm --save-peak` measured, else PEAK_TFLOPS by the GPU's name
peak mem     = the most device memory tensors held (allocated, not the allocator's reserve);
               `reserved`: the most the allocator held from the device (its cache and CUDA
               graphs' private pools too), what an out-of-memory is about
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from primus.core.config import ALL_BACKENDS, ParamSpec, register_params
from primus.core.folders import cache_dir
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import get_logger, write_refused
from primus.core.patches import PatchContext, get_param
from primus.core.reliability.atomic import append_line, write_atomic

register_params(
    ALL_BACKENDS,
    {
        "log_step_metrics": ParamSpec(
            bool,
            "log the step metrics line at the backend's log interval, write metrics.jsonl and "
            "the primus/ tensorboard scalars (default true)",
            default=True,
        ),
        "peak_tflops": ParamSpec(
            float, "the GPU's dense bf16 peak in TFLOP/s for MFU (default: by the GPU's name)"
        ),
    },
)


def metrics_enabled(ctx: PatchContext) -> bool:
    """log_step_metrics is true (default true)"""
    return bool(get_param(ctx, "log_step_metrics", True))


# Dense (no sparsity) bf16 peak TFLOP/s by device-name fragment, most specific first.
PEAK_TFLOPS = (
    ("GB200", 2450.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("MI355", 2500.0),
    ("MI325", 1307.0),
    ("MI300", 1307.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named like `NVIDIA H100 80GB HBM3`, or None if unknown."""
    for fragment, peak in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peak
    return None


def measured_peaks_path() -> Path:
    """Where `primus benchmark gemm --save-peak` keeps each device's measured GEMM rate:
    $PRIMUS_PEAKS, else peaks.json in Primus's user cache (`primus.core.folders.cache_dir`)."""
    if os.environ.get("PRIMUS_PEAKS"):
        return Path(os.environ["PRIMUS_PEAKS"])
    return cache_dir() / "peaks.json"


def measured_peaks() -> dict[str, dict[str, Any]]:
    """Device name -> {"tflops", "how"}: what `--save-peak` recorded ({} when nothing)."""
    try:
        return json.loads(measured_peaks_path().read_text())
    except (OSError, ValueError):
        return {}


def save_measured_peak(device: str, tflops: float, how: str) -> Path:
    """Record `device`'s measured dense GEMM rate (`how`: the GEMM, dtype and date)."""
    path = measured_peaks_path()
    peaks = measured_peaks() | {device: {"tflops": round(tflops, 1), "how": how}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(peaks, indent=2, sort_keys=True) + "\n")
    return path


@dataclass(frozen=True)
class Peak:
    """The peak MFU is measured against, and where it came from."""

    tflops: float | None
    source: Literal["config", "measured", "device table", "unknown"]
    device: str | None = None
    how: str = ""  # a measured peak's GEMM and date

    def describe(self) -> str:
        if self.source == "config":
            return f"MFU peak: {self.tflops:g} TFLOP/s (peak_tflops)"
        if self.source == "measured":
            return (
                f"MFU peak: {self.tflops:g} TFLOP/s ({self.device}, measured by primus "
                f"benchmark gemm --save-peak: {self.how}; {measured_peaks_path()})"
            )
        if self.source == "device table":
            return f"MFU peak: {self.tflops:g} TFLOP/s ({self.device}, by its name)"
        return f"MFU peak: unknown for {self.device or 'no GPU'}, MFU n/a (set peak_tflops)"


def find_peak(configured: float | None, device_name: str | None) -> Peak:
    """`peak_tflops` if set, else the rate `primus benchmark gemm --save-peak` measured on a
    device of this name, else the table's peak for `device_name` (None: not a GPU)."""
    if configured:
        return Peak(float(configured), "config", device_name)
    measured = measured_peaks().get(device_name) if device_name else None
    if measured:
        return Peak(float(measured["tflops"]), "measured", device_name, measured["how"])
    known = peak_tflops(device_name) if device_name else None
    return Peak(known, "device table" if known else "unknown", device_name)


def _flops(tflops: float) -> str:
    return f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.3g}"  # a CPU run shows its digits


@dataclass
class StepMetrics:
    """One logged step: what the step line shows and metrics.jsonl holds."""

    step: int
    total_steps: int
    loss: float | None
    step_seconds: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float | None  # fraction of peak, None when the device's peak is unknown
    lr: float | None = None
    peak_memory_gib: float | None = None
    reserved_memory_gib: float | None = None
    # fine-tuning's eval at this step (primus.core.posttrain.metrics defines them)
    eval_loss: float | None = None
    eval_token_accuracy: float | None = None
    # preference training's rewards (primus.core.posttrain.preference defines them)
    reward_chosen: float | None = None
    reward_rejected: float | None = None
    reward_margin: float | None = None
    reward_accuracy: float | None = None
    # preference training's eval at this step (EVAL_METRICS beside eval_loss)
    eval_reward_chosen: float | None = None
    eval_reward_rejected: float | None = None
    eval_reward_margin: float | None = None
    eval_reward_accuracy: float | None = None

    def line(self) -> str:
        parts = [f"step {self.step}/{self.total_steps}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.eval_loss is not None:
            parts.append(f"eval loss {self.eval_loss:.4f}")
        if self.eval_token_accuracy is not None:
            parts.append(f"eval token acc {self.eval_token_accuracy:.2%}")
        if self.eval_reward_margin is not None:
            parts.append(f"eval reward margin {self.eval_reward_margin:.4f}")
        if self.eval_reward_accuracy is not None:
            parts.append(f"eval reward acc {self.eval_reward_accuracy:.2%}")
        if self.reward_margin is not None:
            parts.append(f"reward margin {self.reward_margin:.4f}")
        if self.reward_accuracy is not None:
            parts.append(f"reward acc {self.reward_accuracy:.2%}")
        if self.lr is not None:
            parts.append(f"lr {self.lr:.3g}")
        parts.append(f"{self.step_seconds * 1000:.1f} ms/step")
        if self.mfu is not None and self.mfu > 1:  # its work ran in another step's time
            parts.append("rates n/a (over the peak: this step's time does not cover its work)")
        else:
            parts += [
                f"{self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU",
                f"{_flops(self.tflops_per_gpu)} TFLOP/s/GPU",
                "MFU n/a" if self.mfu is None else f"MFU {self.mfu:.1%}",
            ]
        if self.peak_memory_gib is not None:
            reserved = self.reserved_memory_gib
            also = f" (reserved {reserved:.1f})" if reserved is not None else ""
            parts.append(f"peak mem {self.peak_memory_gib:.1f} GiB{also}")
        return " | ".join(parts)

    def scalars(self) -> dict[str, float]:
        """The tensorboard scalars every backend adds (MFU only when the peak is known)."""
        values = {
            "primus/tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "primus/tflops_per_gpu": self.tflops_per_gpu,
        }
        rewards = ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy")
        evals = {
            f"primus/{name}": getattr(self, name)
            for name in ("eval_loss", "eval_token_accuracy", *rewards,
                         *(f"eval_{reward}" for reward in rewards))
        }  # fmt: skip
        values |= {k: v for k, v in evals.items() if v is not None}
        return values | ({"primus/mfu": self.mfu} if self.mfu is not None else {})


def step_metrics(
    step: int,
    total_steps: int,
    loss: float | None,
    step_seconds: float,
    tokens_per_step: int,
    flops_per_step: float,
    world_size: int,
    peak: float | None,
    **extra: float | None,
) -> StepMetrics:
    """Derive the per-GPU rates and MFU of one step from its totals (formulas above)."""
    tflops = flops_per_step / step_seconds / world_size / 1e12
    return StepMetrics(
        step,
        total_steps,
        loss,
        step_seconds,
        tokens_per_step / step_seconds / world_size,
        tflops,
        tflops / peak if peak else None,
        **extra,
    )


def append_metrics(path: Path, metrics: StepMetrics) -> None:
    """Add one JSON line to `path` (metrics.jsonl in the run directory) with one write: a
    full disk leaves the file as it was, never with a torn last line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, json.dumps(asdict(metrics)))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, less a torn last line (a line without its newline: a
    writer killed mid-write, or an older Primus on a full disk)."""
    *complete, _torn = path.read_text().split("\n")  # `_torn` is "" after a whole last line
    return [json.loads(line) for line in complete if line.strip()]


class ScalarWriter(Protocol):
    """A tensorboard writer (`torch.utils.tensorboard.SummaryWriter` or alike)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> Any: ...


class MetricsSink:
    """Where a run's step metrics go: the step line to the log, metrics.jsonl, tensorboard."""

    def __init__(self, ctx: PatchContext) -> None:
        self.logger = get_logger(ctx.backend)
        self.metrics_file = ctx.run_dir / "metrics.jsonl" if ctx.run_dir else None
        self.configured_peak: float | None = get_param(ctx, "peak_tflops")
        self.found: Peak | None = None

    def peak(self, device_name: str | None) -> float | None:
        """The peak for MFU on `device_name` (None: not a GPU); found and logged on first call."""
        if self.found is None:
            self.found = find_peak(self.configured_peak, device_name)
            self.logger.info(self.found.describe())
        return self.found.tflops

    def report(
        self, metrics: StepMetrics, *, primary: bool, writer: ScalarWriter | None = None
    ) -> None:
        """Log the step line. The primary rank (the one that owns the run's files) also appends
        metrics.jsonl and adds the scalars to `writer`; if it is not rank 0 it prints the line,
        since the console shows rank 0's log only."""
        self.logger.info(metrics.line())
        refused = write_refused()  # a log file on a full disk: end the run here, at a step
        if refused is not None:
            raise refused
        if not primary:
            return
        if get_torchrun_env().rank != 0:
            print(f"[primus] {metrics.line()}", flush=True)
        if self.metrics_file:
            append_metrics(self.metrics_file, metrics)
        if writer is not None:
            for name, value in metrics.scalars().items():
                writer.add_scalar(name, value, metrics.step)
