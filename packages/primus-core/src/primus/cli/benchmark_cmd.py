"""`primus benchmark gemm|attention|collectives`: what this device (and this job's network)
delivers on a job's own shapes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from primus.cli.common import (
    DEBUG,
    OVERRIDES,
    Debug,
    MasterAddr,
    MasterPort,
    Module,
    Nnodes,
    NodeRank,
    NprocPerNode,
    checked_launch,
    output_file,
)

if TYPE_CHECKING:
    from primus.core.diagnostics.benchmark import Op, Timing
    from primus.core.projection import Job

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Microbenchmarks on this device, with a job's shapes or given ones.",
    no_args_is_help=True,
)

Config = Annotated[
    Path | None, typer.Option("--config", "-c", help="Take the shapes of this experiment's job.")
]
Gpus = Annotated[
    int, typer.Option("--gpus", min=1, help="The job's GPUs (its layout splits the shapes).")
]
Dtype = Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")]
Repeats = Annotated[int, typer.Option("--repeats", min=1, help="Timed calls each.")]
Warmup = Annotated[int, typer.Option("--warmup", min=0, help="Untimed calls first.")]
JsonPath = Annotated[
    Path | None,
    typer.Option("--json", help="Also write the timings as JSON here.", callback=output_file),
]
PICTURES = ("png", "svg", "pdf", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def _picture_file(value: Path | None) -> Path | None:
    """--plot: a file output_file accepts, of a picture format matplotlib writes."""
    value = output_file(value)
    if value is not None and value.suffix.lstrip(".").lower() not in ("", *PICTURES):
        raise typer.BadParameter(
            f"{value.name}: not a picture format; end it in .{', .'.join(PICTURES)}"
        )
    return value


PlotPath = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Also draw the rates against size into this picture (matplotlib; PNG unless "
        "its name ends in .svg, .pdf, ...).",
        callback=_picture_file,
    ),
]


def _training_job(ctx: typer.Context, config: Path, module: str | None, gpus: int) -> Job:
    """The experiment's job on `gpus` GPUs, as the projection takes it. What its build changed
    for the backend's own run is put back: the patches' replacements (a CPU run's torch.cuda
    shims), and the modules it hid (a backend may hide torch, which the timings need)."""
    from primus.core.patches import restore_all
    from primus.core.runtime import PrimusRuntime
    from primus.core.runtime.resolution import unhide_modules

    runtime = PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on)
    runtime.check_world(gpus, f"--gpus {gpus}")  # the job the projection would accept
    job = runtime.training_job(gpus)
    restore_all()
    unhide_modules(runtime.adapter.unused_modules)
    return job


def _run(
    ctx: typer.Context,
    config: Path | None,
    given: list[Op],
    from_job: Callable[[Job], list[Op]],
    gpus: int,
    dtype: str,
    repeats: int,
    warmup: int,
    json_path: Path | None,
    plot_path: Path | None,
    module: str | None,
) -> tuple[str, list[Timing]]:
    """The job's ops (from `config`) and the given ones, timed, printed and written."""
    from primus.core.diagnostics.benchmark import DTYPES, render, run_ops
    from primus.core.errors import ConfigError

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}")
    if config is None and not given:
        raise ConfigError("nothing to time", hint="pass --config EXP.yaml, or --shape")
    ops = list(given)
    if config is not None:
        ops = from_job(_training_job(ctx, config, module, gpus)) + ops
    device, timings = run_ops(ops, dtype, repeats, warmup)
    typer.echo(render(device, dtype, timings), nl=False)
    if json_path is not None:
        from primus.core.reliability.atomic import write_json

        record: dict[str, Any] = {"device": device, "dtype": dtype, "repeats": repeats,
                                  "warmup": warmup, "ops": [t.as_dict() for t in timings]}  # fmt: skip
        write_json(json_path, record)
    if plot_path is not None:
        from primus.core.diagnostics.benchmark_plot import plot_ops

        plot_ops(device, dtype, timings, plot_path)
    return device, timings


@app.command(context_settings=OVERRIDES)
def gemm(
    ctx: typer.Context,
    config: Config = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option("--shape", help="A GEMM MxNxK to time (repeatable), besides the job's."),
    ] = None,
    gpus: Gpus = 1,
    dtype: Dtype = "bf16",
    repeats: Repeats = 20,
    warmup: Warmup = 5,
    json_path: JsonPath = None,
    plot_path: PlotPath = None,
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
    from primus.core.diagnostics.benchmark import parse_shape
    from primus.core.errors import ConfigError

    if save_peak and dtype == "fp32":
        raise ConfigError("--save-peak keeps a bf16 or fp16 rate: MFU is against those peaks")
    if save_peak:
        import torch

        if not torch.cuda.is_available():  # refused before the timing, which runs on the CPU
            raise ConfigError("--save-peak needs a GPU: MFU is not reported for a CPU")
    given: list[Op] = [parse_shape(shape) for shape in shapes or []]
    device, timings = _run(ctx, config, given, _gemms, gpus, dtype, repeats, warmup, json_path,
                           plot_path, module)  # fmt: skip
    if save_peak:
        _save_peak(device, dtype, timings)


@app.command(context_settings=OVERRIDES)
def attention(
    ctx: typer.Context,
    config: Config = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="An attention BxHxKVxSxD (batch, heads, KV heads, sequence, head dim) to time "
            "(repeatable), besides the job's.",
        ),
    ] = None,
    gpus: Gpus = 1,
    dtype: Dtype = "bf16",
    repeats: Repeats = 20,
    warmup: Warmup = 5,
    json_path: JsonPath = None,
    plot_path: PlotPath = None,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Time causal attention on this device (torch's SDPA, the kernel it picks): one GPU's
    heads of the experiment's job for a micro batch, and any `--shape`. Forward only; FLOPs
    count half the score matrix (the causal mask). Overrides may follow the options."""
    from primus.core.diagnostics.benchmark import job_attention, parse_attention

    given: list[Op] = [parse_attention(shape) for shape in shapes or []]
    _run(ctx, config, given, lambda job: [job_attention(job)], gpus, dtype, repeats, warmup,
         json_path, plot_path, module)  # fmt: skip


def _gemms(job: Job) -> list[Op]:
    from primus.core.diagnostics.benchmark import job_gemms

    return list(job_gemms(job))


def _save_peak(device: str, dtype: str, timings: list[Timing]) -> None:
    """The fastest GEMM's median rate as `device`'s MFU peak (primus.core.metrics)."""
    import datetime

    from primus.core.metrics import save_measured_peak

    best = max(timings, key=lambda t: t.tflops)
    how = f"{best.op.shape} {dtype}, {datetime.date.today().isoformat()}"
    path = save_measured_peak(device, best.tflops, how)
    typer.echo(f"MFU peak of {device}: {best.tflops:.1f} TFLOP/s ({how}), saved in {path}")


DEFAULT_SIZES = {"cuda": ["1MiB", "16MiB", "256MiB"], "cpu": ["64KiB", "1MiB", "4MiB"]}


@app.command(context_settings=OVERRIDES)
def collectives(
    ctx: typer.Context,
    config: Config = None,
    sizes: Annotated[
        list[str] | None,
        typer.Option(
            "--size",
            help="A message to time, SIZE or NAME=SIZE (64MiB, 4m, 65536; repeatable), besides "
            "the job's. Default without --config: 1, 16 and 256 MiB (64 KiB to 4 MiB on CPU).",
        ),
    ] = None,
    gpus: Gpus = 1,
    repeats: Repeats = 20,
    warmup: Warmup = 5,
    json_path: JsonPath = None,
    plot_path: PlotPath = None,
    nproc_per_node: NprocPerNode = 1,
    nnodes: Nnodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Time all-reduce, all-gather and reduce-scatter over every rank (NCCL on GPUs, gloo on
    CPU), launched like `primus train`: the messages of the experiment's job (a layer's
    activations that tensor parallelism all-reduces, one GPU's gradients that data
    parallelism reduces) and any `--size`. Median time, algorithm and bus bandwidth
    (nccl-tests' formulas); rank 0 prints the table. Overrides may follow the options."""
    from primus.core.diagnostics.benchmark import parse_size, render_collectives, run_collectives
    from primus.core.errors import ConfigError
    from primus.core.launch.dist_env import under_torchrun
    from primus.core.launch.workers import launch_workers

    # decided before the experiment's build, which may set a rank's environment variables
    launching = (nproc_per_node > 1 or nnodes > 1) and not under_torchrun()
    launch = checked_launch(nproc_per_node, nnodes, node_rank, master_addr, master_port)
    messages = {}
    for text in sizes or []:
        name, _, size = text.rpartition("=")
        if (name or size) in messages:  # the first would be dropped without a word
            raise ConfigError(f"--size {text}: message '{name or size}' is given twice",
                              hint="name each message once: NAME=SIZE")  # fmt: skip
        messages[name or size] = parse_size(size)
    if config is not None:
        from primus.core.diagnostics.benchmark import job_collective_sizes

        messages = job_collective_sizes(_training_job(ctx, config, module, gpus)) | messages
    if not messages:
        import torch

        defaults = DEFAULT_SIZES["cuda" if torch.cuda.is_available() else "cpu"]
        messages = {size: parse_size(size) for size in defaults}
    if launching:
        worker = ["benchmark", "collectives", "--repeats", str(repeats), "--warmup", str(warmup)]
        worker += [
            arg for name, nbytes in messages.items() for arg in ("--size", f"{name}={nbytes}")
        ]
        worker += ["--json", str(json_path.absolute())] if json_path else []
        worker += ["--plot", str(plot_path.absolute())] if plot_path else []
        raise typer.Exit(launch_workers("torchrun", worker, launch))
    result = run_collectives(messages, repeats, warmup)
    if result is None:  # not rank 0
        return
    device, ranks, rows = result
    typer.echo(render_collectives(device, ranks, rows), nl=False)
    if json_path is not None:
        from primus.core.reliability.atomic import write_json

        record = {"device": device, "ranks": ranks, "repeats": repeats, "rows": rows}
        write_json(json_path, record)
    if plot_path is not None:
        from primus.core.diagnostics.benchmark_plot import plot_collectives

        plot_collectives(device, ranks, rows, plot_path)
