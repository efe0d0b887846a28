"""`primus projection memory|performance`: what one GPU of a job will hold, and how fast the
job will run, before it runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from primus.cli.common import DEBUG, OVERRIDES, ConfigFile, Debug, Module, output_file

if TYPE_CHECKING:
    from primus.core.metrics import Peak
    from primus.core.projection import Job, Projection
    from primus.core.projection.performance import Candidate, Rates, StepTime
    from primus.core.runtime import PrimusRuntime

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Projections of a job before it runs (no GPU needed).",
    no_args_is_help=True,
)

PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "output_layer",
         "graph_pool")  # fmt: skip
OPTIONAL_PARTS = ("output_layer", "graph_pool")  # shown where the job has them
TERMS = ("gemm", "attention", "memory_bound", "optimizer", "tensor_parallel", "data_parallel",
         "kernel_gaps", "pipeline_bubble")  # fmt: skip
Gpus = Annotated[
    int, typer.Option("--gpus", min=1, help="GPUs of the job (data parallel fills the rest).")
]
JsonPath = Annotated[
    Path | None,
    typer.Option("--json", help="Also write the projection as JSON here.", callback=output_file),
]


GRAPH_POOL = (
    "graph_pool: the activations and logits once more, in the CUDA graph's private "
    "pool (a run without the graph does not hold it)"
)


def _layout(job: Job) -> str:
    gpus = f"{job.gpus} GPU" + "s" * (job.gpus != 1)
    return (
        f"{gpus} = tp {job.tp} x pp {job.pp} x cp {job.cp} x dp {job.dp}"
        + (f" (ep {job.ep})" if job.ep > 1 else "")
        + f"; ZeRO stage {job.zero}"
    )


def _count(n: float) -> str:
    """A parameter count in billions (1.236 B), or in millions or thousands when smaller."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:,.0f}"


def _table(job: Job, projection: Projection) -> str:
    from primus.core.projection import GIB

    on = {True: "on", False: "off"}
    parts = [p for p in PARTS if p not in OPTIONAL_PARTS or getattr(projection, p)]
    freed = ("gradients freed between steps: the total takes the larger of them and of the "
             "activations with the loss")  # fmt: skip
    lines = [
        f"model: {_count(projection.parameters)} parameters, "
        f"{_count(projection.parameters_per_gpu)} on the most loaded GPU",
        f"layout: {_layout(job)}",
        f"micro batch {job.micro_batch} x {job.seq_len} tokens; recompute {job.recompute}; "
        f"flash attention {on[job.flash_attention]}; sequence parallel "
        f"{on[job.sequence_parallel]}",
        f"{'':<12} {'GiB':>8}",
        *(f"{part:<12} {getattr(projection, part) / GIB:>8.2f}" for part in parts),
        f"{'total':<12} {projection.total / GIB:>8.2f}",
        *([] if projection.gradients_kept else [freed]),
        *([GRAPH_POOL] if projection.graph_pool else []),
        "not included: the CUDA context, the allocator's cache and fragmentation, "
        "communication buffers, kernel workspaces",
    ]
    return "\n".join(lines)


def _quiet(runtime: PrimusRuntime) -> PrimusRuntime:
    """A projection builds the model, not a run: the patches' and the upstream's start-up
    messages (INFO lines, Python warnings) stay out of its output; errors and Primus's
    warnings do not, and --debug shows everything."""
    if not runtime.debug:
        import warnings

        from primus.core.logging import setup_logging

        setup_logging("WARNING")
        warnings.simplefilter("ignore")
    return runtime


@app.command(context_settings=OVERRIDES)
def memory(
    ctx: typer.Context,
    config: ConfigFile,
    gpus: Gpus = 1,
    json_path: JsonPath = None,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Per-GPU memory of the experiment's training: weights, gradients, optimizer state,
    activations and logits on the most loaded GPU, from the model and the parallel layout
    (docs/operations.md). Overrides may follow the options."""
    from dataclasses import asdict

    from primus.core.projection import project
    from primus.core.runtime import PrimusRuntime

    runtime = _quiet(PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on))
    runtime.check_world(gpus, f"--gpus {gpus}")  # as the run would, before the build's seconds
    job = runtime.training_job(gpus)
    projection = project(job)
    typer.echo(_table(job, projection))
    if json_path is not None:
        from primus.core.reliability.atomic import write_json

        record = {"job": asdict(job), "bytes": projection.as_dict()}
        write_json(json_path, record)


def _step(step: StepTime, rates: Rates, peak: Peak) -> str:
    mfu = f"{step.mfu:.1%}" if step.mfu is not None else "n/a (no peak for this device)"
    lines = [
        f"rates: {rates.device}, {rates.source}: GEMM {rates.gemm_tflops:.0f} TFLOP/s, "
        f"attention {rates.attention_tflops:.0f} TFLOP/s, memory {rates.memory_gbs:.0f} GB/s, "
        f"bus {rates.bus_gbs:.0f} GB/s",
        f"{'':<16} {'ms/step':>9}",
        *(f"{term:<16} {getattr(step, term):>9.1f}" for term in TERMS),
        f"{'host floor':<16} {step.host_floor:>9.1f}",
        f"{'step':<16} {step.step:>9.1f}   (the GPU's terms, or the host floor when larger)",
        f"tokens/s/GPU {step.tokens_per_s_per_gpu:,.0f}; model TFLOP/s/GPU "
        f"{step.model_tflops_per_gpu:.1f}; MFU {mfu}",
        peak.describe(),  # the peak a run's step line would use
    ]
    return "\n".join(lines)


def _fit(gib: float, rates: Rates, top: int) -> str:
    """The layout's memory against the device's; where it does not fit, what to do."""
    from primus.core.projection.performance import HEADROOM

    line = f"memory: {gib:.1f} GiB on the most loaded GPU (primus projection memory)"
    room = rates.memory_gib * (1 - HEADROOM)
    if gib <= room:
        return f"{line}, of {rates.device}'s {rates.memory_gib:.0f} GiB"
    fix = "the layouts below fit" if top else "--top lists layouts that fit"
    return (f"{line}: DOES NOT FIT {rates.device}'s {rates.memory_gib:.0f} GiB less "
            f"{HEADROOM:.0%} headroom ({room:.0f} GiB); the times below are for a run that would "
            f"end out of memory ({fix})")  # fmt: skip


def _ranking(candidates: list[Candidate], changes: list[dict[str, object]]) -> str:
    if not candidates:
        return "no layout fits these GPUs' memory"
    lines = [f"{'rank':<5} {'ms/step':>9} {'tokens/s/GPU':>13} {'GiB':>6}  overrides"]
    for i, (c, change) in enumerate(zip(candidates, changes, strict=True), 1):
        pasted = " ".join(f"{k}={json.dumps(v)}" for k, v in change.items()) or "(as configured)"
        lines.append(f"{i:<5} {c.step.step:>9.1f} {c.step.tokens_per_s_per_gpu:>13,.0f} "
                     f"{c.memory_gib:>6.1f}  {pasted}")  # fmt: skip
    return "\n".join(lines)


@app.command(context_settings=OVERRIDES)
def performance(
    ctx: typer.Context,
    config: ConfigFile,
    gpus: Gpus = 1,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="The GPU to project for (H100, H200, MI300X; default: "
            "the device of the --measured files, else H100).",
        ),
    ] = None,
    measured: Annotated[
        list[Path] | None,
        typer.Option(
            "--measured",
            exists=True,
            dir_okay=False,
            help="`primus benchmark gemm|attention|collectives --config ... --json` "
            "files measured on the device: their rates replace the table's.",
        ),
    ] = None,
    top: Annotated[
        int,
        typer.Option(
            "--top",
            min=0,
            help="Also list this many of the layouts that fit --gpus, fastest first (0: none).",
        ),
    ] = 10,
    json_path: JsonPath = None,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Step time, tokens/s and MFU of the experiment's training on --gpus GPUs, term by term
    (GEMMs, attention, memory-bound kernels, optimizer, collectives, pipeline bubble, the
    host), then the parallel layouts and micro batches that fit those GPUs, fastest first, as
    overrides to paste (docs/operations.md). Overrides may follow the options."""
    from dataclasses import asdict

    from primus.core.errors import ConfigError
    from primus.core.projection import project
    from primus.core.projection.performance import project_run, rank_layouts, rates_for
    from primus.core.runtime import PrimusRuntime

    rates = rates_for(device, list(measured or []))
    runtime = _quiet(PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on))
    runtime.check_world(gpus, f"--gpus {gpus}")  # as the run would, before the build's seconds
    run = project_run(runtime, gpus, rates)
    job, peak, step = run.job, run.peak, run.step
    typer.echo(f"layout: {_layout(job)}; micro batch {job.micro_batch}, recompute {job.recompute}")
    typer.echo(_fit(project(job).total / 2**30, rates, top))
    typer.echo(_step(step, rates, peak))
    configured = runtime.adapter.layout_overrides(job) if top else {}
    ranked, changes = [], []
    for candidate in rank_layouts(job, gpus, rates) if top else []:
        try:
            keys = runtime.adapter.layout_overrides(candidate.job)
        except ConfigError:  # a layout this backend cannot run
            continue
        ranked.append(candidate)
        changes.append({k: v for k, v in keys.items() if configured.get(k) != v})
        if len(ranked) == top:
            break
    if top:
        typer.echo(f"\nlayouts on {gpus} GPUs that fit {rates.memory_gib:.0f} GiB, fastest first:")
        typer.echo(_ranking(ranked, changes))
    if json_path is not None:
        from primus.core.reliability.atomic import write_json

        record = {"job": asdict(job), "rates": asdict(rates), "peak": asdict(peak),
                  "step_ms": step.as_dict(),
                  "memory_bytes": project(job).as_dict(),
                  "ranked": [{"overrides": k, "memory_gib": c.memory_gib, "step_ms": c.step.as_dict()}
                             for c, k in zip(ranked, changes, strict=True)]}  # fmt: skip
        write_json(json_path, record)
