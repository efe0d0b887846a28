"""What the benchmark scripts share: the resolved experiment, running a command, the report."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any


def resolved(config: Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """A Primus experiment with `overrides` (key=value), as `primus config show` resolves it."""
    out = subprocess.run(
        [sys.executable, "-m", "primus.cli", "config", "show", str(config), "--format", "json",
         *overrides],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def resolved_params(config: Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The single module's params of a resolved experiment (`resolved`)."""
    return module_params(resolved(config, overrides))


def module_params(experiment: dict[str, Any]) -> dict[str, Any]:
    """The single module's params of a resolved experiment."""
    return next(iter(experiment["modules"].values()))["overrides"]


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> str:
    """Run `command`, keep its output in `log`, stop the benchmark if it fails."""
    print("$", " ".join(command), flush=True)
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    log.write_text(result.stdout + result.stderr)
    if result.returncode:
        raise SystemExit(f"failed ({result.returncode}); see {log}:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def device_label() -> str | None:
    """None on a CUDA machine (environment() then names the GPU), else the CPU and its cores."""
    import torch

    return None if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"


def gpu_name() -> str:
    """GPU 0's name from nvidia-smi (no CUDA context in the benchmark's own process: the runs
    need the memory)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.splitlines()[0].strip()


def environment(distributions: tuple[str, ...], device: str | None = None) -> dict[str, Any]:
    """Date, device (default: torch's name for it) and the versions of those `distributions`
    that are installed, for the JSON report."""
    if device is None:
        import torch

        device = torch.cuda.get_device_name()
    return {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "versions": {
            "python": platform.python_version(),
            **{d: metadata.version(d) for d in distributions if installed(d)},
        },
    }


# The step-metric columns every benchmark table has: (title, summary key, format spec).
COLUMNS = (
    ("tokens/s/GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("TFLOP/s/GPU", "tflops_per_gpu", ".1f"),
    ("MFU", "mfu", ".1%"),
    ("peak mem GiB", "peak_memory_gib", ".1f"),
)


def medians(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    """The median over runs of each key."""
    return {key: statistics.median(r[key] for r in runs) for key in keys}


def print_table(
    summary: dict[str, dict[str, Any]], columns: tuple[tuple[str, str, str], ...], ratio: str
) -> None:
    """A Markdown row per run: columns are (title, key, format spec), None prints n/a; then
    the ratio line."""
    print("| run | " + " | ".join(title for title, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, values in summary.items():
        cells = ("n/a" if values[k] is None else format(values[k], spec) for _, k, spec in columns)
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(ratio)


def flops_per_token(shape: dict[str, int], causal: bool) -> float:
    """Training FLOPs per token of a dense Llama-style decoder, one formula for every backend.

    `shape`: layers, hidden, ffn, heads, kv_heads, vocab, seq. 6 x the matmul weights (the
    input embedding is a lookup: not counted; the output layer is) plus attention's score and
    value products: 12 x layers x hidden x seq (PaLM's and TorchTitan's convention), or half
    that when `causal` (MaxText's: the masked half is not computed).
    """
    d, kv = shape["hidden"], shape["hidden"] * shape["kv_heads"] // shape["heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * shape["ffn"]
    weights = shape["layers"] * per_layer + shape["vocab"] * d
    attention = 12 * shape["layers"] * d * shape["seq"]
    return 6 * weights + (attention / 2 if causal else attention)


def mfu_both_ways(tokens_per_s_per_gpu: float, shape: dict[str, int], peak: float | None) -> dict:
    """MFU with attention counted whole and with causal attention halved (see flops_per_token)."""
    return {
        f"mfu_{name}": (
            tokens_per_s_per_gpu * flops_per_token(shape, causal) / (peak * 1e12) if peak else None
        )
        for name, causal in (("full_attention", False), ("causal_attention", True))
    }


MFU_COLUMNS = (
    ("MFU (attention whole)", "mfu_full_attention", ".1%"),
    ("MFU (causal halved)", "mfu_causal_attention", ".1%"),
)


def cuda_median_ms(step: Callable[[], Any], reps: int) -> float:
    """Median ms of `step` over `reps` eager runs after 5 warm-ups (CUDA events)."""
    import torch

    for _ in range(5):
        step()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
