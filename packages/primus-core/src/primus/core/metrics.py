"""Training metrics every backend reports the same way: the step line and metrics.jsonl.

tokens/s/GPU = global batch tokens per step / step seconds / world size
TFLOP/s/GPU  = model FLOPs per step (forward + backward, the backend's count, which it
               names) / step seconds / world size / 1e12
MFU          = TFLOP/s/GPU / the GPU's dense bf16 peak (PEAK_TFLOPS; `peak_tflops` overrides)
peak mem     = the most device memory tensors held (allocated, not the allocator's reserve)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

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

    def line(self) -> str:
        parts = [f"step {self.step}/{self.total_steps}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.lr is not None:
            parts.append(f"lr {self.lr:.3g}")
        parts += [
            f"{self.step_seconds * 1000:.1f} ms/step",
            f"{self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU",
            f"{_flops(self.tflops_per_gpu)} TFLOP/s/GPU",
            f"MFU {self.mfu:.1%}" if self.mfu is not None else "MFU n/a",
        ]
        if self.peak_memory_gib is not None:
            parts.append(f"peak mem {self.peak_memory_gib:.1f} GiB")
        return " | ".join(parts)

    def scalars(self) -> dict[str, float]:
        """The tensorboard scalars every backend adds (MFU only when the peak is known)."""
        values = {
            "primus/tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "primus/tflops_per_gpu": self.tflops_per_gpu,
        }
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
    """Add one JSON line to `path` (metrics.jsonl in the run directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(asdict(metrics)) + "\n")
