"""`primus benchmark gemm`: what this device delivers on a job's own GEMMs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from primus.cli.common import DEBUG, OVERRIDES, Debug, Module

if TYPE_CHECKING:
    from primus.core.benchmark import Timing

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Microbenchmarks on this device, with a job's shapes or given ones.",
    no_args_is_help=True,
)


@app.command(context_settings=OVERRIDES)
def gemm(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Take the GEMMs of this experiment's job."),
    ] = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option("--shape", help="A GEMM MxNxK to time (repeatable), besides the job's."),
    ] = None,
    gpus: Annotated[
        int, typer.Option("--gpus", min=1, help="The job's GPUs (its layout splits the GEMMs).")
    ] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed calls a GEMM.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed calls first.")] = 5,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the timings as JSON here.")
    ] = None,
    save_peak: Annotated[
        bool,
        typer.Option(
            "--save-peak",
            help="Keep the best rate timed here as this GPU model's peak for MFU (bf16/fp16).",
        ),
    ] = False,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Time GEMMs on this device (the GPU if there is one): the forward GEMMs one GPU of the
    experiment's job runs for a micro batch (QKV, attention output, MLP up and down, logits),
    and any `--shape`. Median of the repeats, their spread, TFLOP/s and % of the device's
    dense peak (docs/operations.md). Overrides may follow the options."""
    from primus.core.benchmark import DTYPES, job_gemms, parse_shape, render, run_gemms
    from primus.core.errors import ConfigError

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}")
    if config is None and not shapes:
        raise ConfigError("nothing to time", hint="pass --config EXP.yaml, or --shape MxNxK")
    gemms = [parse_shape(shape) for shape in shapes or []]
    if config is not None:
        from primus.core.patches import restore_all
        from primus.core.runtime import PrimusRuntime

        runtime = PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on)
        gemms = job_gemms(runtime.training_job(gpus)) + gemms
        restore_all()  # what the build's patches replaced (a CPU run's torch.cuda shims)
    if save_peak and dtype == "fp32":
        raise ConfigError("--save-peak keeps a bf16 or fp16 rate: MFU is against those peaks")
    device, timings = run_gemms(gemms, dtype, repeats, warmup)
    typer.echo(render(device, dtype, timings), nl=False)
    if save_peak:
        _save_peak(device, dtype, timings)
    if json_path is not None:
        record = {"device": device, "dtype": dtype, "repeats": repeats, "warmup": warmup,
                  "gemms": [t.as_dict() for t in timings]}  # fmt: skip
        json_path.write_text(json.dumps(record, indent=2) + "\n")


def _save_peak(device: str, dtype: str, timings: list[Timing]) -> None:
    """The fastest GEMM's median rate as `device`'s MFU peak (primus.core.metrics)."""
    import datetime

    from primus.core.errors import ConfigError
    from primus.core.metrics import save_measured_peak

    if device == "cpu":
        raise ConfigError("--save-peak needs a GPU: MFU is not reported for a CPU")
    best = max(timings, key=lambda t: t.tflops)
    g = best.gemm
    how = f"{g.m}x{g.n}x{g.k} {dtype}, {datetime.date.today().isoformat()}"
    path = save_measured_peak(device, best.tflops, how)
    typer.echo(f"MFU peak of {device}: {best.tflops:.1f} TFLOP/s ({how}), saved in {path}")
