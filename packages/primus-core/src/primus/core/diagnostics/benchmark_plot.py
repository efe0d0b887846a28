"""`primus benchmark ... --plot F.png`: the rates against size, drawn with matplotlib (the
`plots` extra of primus-core), imported only here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.diagnostics.benchmark import Timing
from primus.core.errors import ConfigError
from primus.core.reliability.atomic import atomic_file


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib", hint="pip install 'primus-core[plots]'"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_ops(device: str, dtype: str, timings: list[Timing], path: Path) -> None:
    """TFLOP/s (at the median; bars from the slowest to the fastest repeat) against each op's
    FLOPs, labelled with its name, and the device's peak when known."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 5))
    for t in timings:
        rates = [t.op.flops / (ms / 1e3) / 1e12 for ms in (t.max_ms, t.min_ms)]
        axes.errorbar(t.op.flops, t.tflops, yerr=[[t.tflops - rates[0]], [rates[1] - t.tflops]],
                      fmt="o", capsize=3)  # fmt: skip
        axes.annotate(t.op.name, (t.op.flops, t.tflops), textcoords="offset points",
                      xytext=(4, 4), fontsize=8)  # fmt: skip
    peaks = {100 * t.tflops / t.peak_pct for t in timings if t.peak_pct}
    for peak in peaks:
        axes.axhline(peak, linestyle="--", color="gray", label=f"peak {peak:g} TFLOP/s")
    axes.set(xscale="log", xlabel="FLOPs per call", ylabel="TFLOP/s (median)",
             title=f"{device}, {dtype}")  # fmt: skip
    if peaks:
        axes.legend()
    _save(figure, path)


def plot_collectives(device: str, ranks: int, rows: list[dict[str, Any]], path: Path) -> None:
    """Bus bandwidth against message size, a line per collective."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 5))
    for op in dict.fromkeys(r["op"] for r in rows):
        points = sorted((r["bytes"], r["busbw_gbs"]) for r in rows if r["op"] == op)
        axes.plot(*zip(*points, strict=True), marker="o", label=op)
    axes.set(xscale="log", xlabel="message bytes", ylabel="bus bandwidth GB/s (median)",
             title=f"{ranks} ranks, {device}")  # fmt: skip
    axes.legend()
    _save(figure, path)


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    with atomic_file(path, "wb") as out:  # a full disk leaves no half-written picture
        figure.savefig(out, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    figure.clf()
