"""`primus projection memory`: what one GPU of a job will hold, before the job runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from primus.cli.common import DEBUG, OVERRIDES, ConfigFile, Debug, Module

if TYPE_CHECKING:
    from primus.core.projection import Job, Projection

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Projections of a job before it runs (no GPU needed).",
    no_args_is_help=True,
)

PARTS = ("weights", "gradients", "optimizer", "activations", "logits")


def _table(job: Job, projection: Projection) -> str:
    from primus.core.projection import GIB

    on = {True: "on", False: "off"}
    lines = [
        f"model: {projection.parameters / 1e9:.3f} B parameters, "
        f"{projection.parameters_per_gpu / 1e9:.3f} B on the most loaded GPU",
        f"layout: {job.gpus} GPUs = tp {job.tp} x pp {job.pp} x cp {job.cp} x dp {job.dp}"
        + (f" (ep {job.ep})" if job.ep > 1 else "")
        + f"; ZeRO stage {job.zero}",
        f"micro batch {job.micro_batch} x {job.seq_len} tokens; recompute {job.recompute}; "
        f"flash attention {on[job.flash_attention]}; sequence parallel "
        f"{on[job.sequence_parallel]}",
        f"{'':<12} {'GiB':>8}",
        *(f"{part:<12} {getattr(projection, part) / GIB:>8.2f}" for part in PARTS),
        f"{'total':<12} {projection.total / GIB:>8.2f}",
        "not included: the CUDA context, the allocator's cache and fragmentation, "
        "communication buffers, kernel workspaces",
    ]
    return "\n".join(lines)


@app.command(context_settings=OVERRIDES)
def memory(
    ctx: typer.Context,
    config: ConfigFile,
    gpus: Annotated[
        int, typer.Option("--gpus", min=1, help="GPUs of the job (data parallel fills the rest).")
    ] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the projection as JSON here.")
    ] = None,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Per-GPU memory of the experiment's training: weights, gradients, optimizer state,
    activations and logits on the most loaded GPU, from the model and the parallel layout
    (docs/operations.md). Overrides may follow the options."""
    from dataclasses import asdict

    from primus.core.projection import project
    from primus.core.runtime import PrimusRuntime

    runtime = PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on)
    job = runtime.training_job(gpus)
    projection = project(job)
    typer.echo(_table(job, projection))
    if json_path is not None:
        record = {"job": asdict(job), "bytes": projection.as_dict()}
        json_path.write_text(json.dumps(record, indent=2) + "\n")
