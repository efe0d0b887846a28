"""`primus slurm pretrain|posttrain`: write an sbatch script into the run directory, submit it."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import DEBUG, OVERRIDES, ConfigFile, Debug, Module

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Run an experiment as a Slurm batch job: one Primus launcher per node, through srun.",
    no_args_is_help=True,
)


def _command(stage: str) -> Callable[..., None]:
    def command(
        ctx: typer.Context,
        config: ConfigFile,
        module: Module = None,
        nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Nodes to run on.")] = 1,
        nproc_per_node: Annotated[
            int,
            typer.Option(
                "--nproc-per-node", min=1, help="Worker processes per node (one per GPU)."
            ),
        ] = 1,
        gpus_per_node: Annotated[
            int | None,
            typer.Option(
                "--gpus-per-node",
                min=0,
                help="GPUs to ask for on each node; 0 asks for none (CPU runs). "
                "[default: --nproc-per-node]",
                show_default=False,
            ),
        ] = None,
        partition: Annotated[
            str | None, typer.Option("--partition", "-p", help="The Slurm partition to run in.")
        ] = None,
        account: Annotated[
            str | None, typer.Option("--account", "-A", help="The Slurm account to charge.")
        ] = None,
        time: Annotated[
            str | None,
            typer.Option("--time", "-t", help="Time limit, as sbatch takes it (4:00:00, 1-12)."),
        ] = None,
        cpus_per_node: Annotated[
            int | None,
            typer.Option(
                "--cpus-per-node",
                min=1,
                help="CPUs to ask for on each node. [default: whole nodes, --exclusive]",
                show_default=False,
            ),
        ] = None,
        container_image: Annotated[
            str | None,
            typer.Option(
                "--container-image",
                help="Run each node's launcher in this image (srun's pyxis/enroot flag); "
                "`primus` must be on its PATH.",
            ),
        ] = None,
        container_mounts: Annotated[
            str | None,
            typer.Option(
                "--container-mounts", help="SRC:DST[,...] to mount; the run directory included."
            ),
        ] = None,
        requeue: Annotated[
            bool,
            typer.Option(
                "--requeue",
                help="When the run is preempted (exit 75, a checkpoint written), requeue the "
                "job: it resumes from that checkpoint.",
            ),
        ] = False,
        warn: Annotated[
            int,
            typer.Option(
                "--warn",
                min=1,
                max=65535,
                help="Seconds before the time limit at which Slurm sends SIGUSR1: the run "
                "saves a checkpoint and stops (allow a step and a save).",
            ),
        ] = 300,
        sbatch: Annotated[
            list[str] | None,
            typer.Option(
                "--sbatch", help="One more sbatch option, e.g. --sbatch=--qos=high (repeatable)."
            ),
        ] = None,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Print the script; write and submit nothing.")
        ] = False,
        debug: Debug = False,
    ) -> None:
        from primus.core.launch.slurm import (
            TIME_FORMATS,
            SlurmJob,
            name_problem,
            render,
            sbatch_conflict,
            submit,
            time_limit_problem,
        )
        from primus.core.reliability.atomic import write_atomic
        from primus.core.runtime import PrimusRuntime

        if time is not None and (why := time_limit_problem(time)):
            raise typer.BadParameter(f"{why} (formats: {TIME_FORMATS})", param_hint="--time")
        bad = [s for s in sbatch or [] if not re.match(r"--?[A-Za-z]", s)]
        if bad:
            raise typer.BadParameter(f"{bad[0]!r} is not an option", param_hint="--sbatch")
        for flag, given in (("--partition", partition), ("--account", account),
                            ("--container-image", container_image)):  # fmt: skip
            if given is not None and not given.strip():
                raise typer.BadParameter("is empty: name one, or leave the option out",
                                         param_hint=flag)  # fmt: skip
        for flag, given in (("--partition", partition), ("--account", account),
                            ("--container-image", container_image),
                            ("--container-mounts", container_mounts),
                            *(("--sbatch", s) for s in sbatch or [])):  # fmt: skip
            if given is not None and re.search(r"[\x00-\x1f\x7f]", given):
                # a newline would end the #SBATCH line: the rest a command of the script
                raise typer.BadParameter(f"{given!r} holds a control character (a newline?)",
                                         param_hint=flag)  # fmt: skip
        for flag, given in (("--partition", partition), ("--account", account)):
            if given is not None and (why := name_problem(given)):
                raise typer.BadParameter(why, param_hint=flag)
        if container_mounts is not None:
            if container_image is None:
                raise typer.BadParameter("mounts go into a container: name its --container-image",
                                         param_hint="--container-mounts")  # fmt: skip
            unpaired = [m for m in container_mounts.split(",") if ":" not in m.strip(":")]
            if unpaired:
                raise typer.BadParameter(f"{unpaired[0]!r} is not SRC:DST",
                                         param_hint="--container-mounts")  # fmt: skip
        overrides = list(ctx.args)
        # fails fast: the workspace and the inputs, as the job's launch checks them
        runtime = PrimusRuntime(config, overrides, stage, module, debug=DEBUG.on, check_inputs=True)
        runtime.check_world(nnodes * nproc_per_node, f"--nnodes {nnodes} x --nproc-per-node "
                            f"{nproc_per_node}")  # fmt: skip
        job = SlurmJob(
            nodes=nnodes,
            nproc_per_node=nproc_per_node,
            gpus_per_node=nproc_per_node if gpus_per_node is None else gpus_per_node,
            job_name=f"primus-{runtime.experiment.exp_name}",
            partition=partition,
            account=account,
            time=time,
            cpus_per_node=cpus_per_node,
            container_image=container_image,
            container_mounts=container_mounts,
            requeue=requeue,
            warn_s=warn,
            sbatch_args=tuple(sbatch or ()),
        )
        for option in sbatch or []:
            if why := sbatch_conflict(option, job):
                raise typer.BadParameter(f"{option!r}: {why}", param_hint="--sbatch")
        train_args = [
            "--config",
            str(Path(config).resolve()),
            *(["--module", module] if module else []),
            *(["--debug"] if DEBUG.on else []),
            *overrides,
        ]
        script = render(job, stage, train_args, runtime.run_dir, sys.executable)
        if dry_run:
            typer.echo(script, nl=False)
            return
        (runtime.run_dir / "logs").mkdir(parents=True, exist_ok=True)  # sbatch makes none
        path = runtime.run_dir / f"slurm-{stage}.sbatch"
        write_atomic(path, script)
        job_id = submit(path)
        typer.echo(f"submitted job {job_id}: {path}")
        typer.echo(f"log: {runtime.run_dir / 'logs' / f'slurm-{job_id}.out'}")

    command.__doc__ = (
        f"Submit the {stage} stage of an experiment to Slurm (sbatch). The script goes into the "
        "run directory, which every node must see (a shared filesystem); the job inherits this "
        "shell's environment (NCCL_*, JAX's variables, PRIMUS_WORKSPACE). Overrides may follow "
        "the options."
    )
    return command


EPILOG = (
    "The same experiment on one GPU, N GPUs, N nodes: `primus train pretrain -c exp.yaml`, "
    "`... --nproc-per-node 8`, `primus slurm pretrain -c exp.yaml --nnodes 4 --nproc-per-node "
    "8 -p gpu -t 12:00:00 --requeue`. See docs/multi-node.md."
)
app.command("pretrain", context_settings=OVERRIDES, epilog=EPILOG)(_command("pretrain"))
app.command("posttrain", context_settings=OVERRIDES, epilog=EPILOG)(_command("posttrain"))
