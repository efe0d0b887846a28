"""`primus train pretrain|posttrain`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import (
    DEBUG,
    OVERRIDES,
    ConfigFile,
    Debug,
    MasterAddr,
    MasterPort,
    Module,
    Nnodes,
    NodeRank,
    NprocPerNode,
    checked_launch,
)
from primus.cli.completion import OverridesCommand

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Train a model with the backend the experiment names.",
    no_args_is_help=True,
)


def _command(stage: str) -> Callable[..., None]:
    def command(
        ctx: typer.Context,
        config: ConfigFile,
        module: Module = None,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="Check everything a run checks before it starts, without importing the "
                "framework (as `config validate`), and print the trainer and the patch plan; "
                "train nothing, write nothing.",
            ),
        ] = False,
        full: Annotated[
            bool,
            typer.Option(
                "--full",
                help="With --dry-run: also build the backend's args with the framework, as the "
                "run does (its own validation, the setup and build_args patches), and print "
                "them.",
            ),
        ] = False,
        nproc_per_node: NprocPerNode = 1,
        nnodes: Nnodes = 1,
        node_rank: NodeRank = 0,
        master_addr: MasterAddr = None,
        master_port: MasterPort = None,
        debug: Debug = False,
    ) -> None:
        from primus.core.reliability import preemption

        preemption.watch(setting_up=True)  # a signal during set-up: no workers, or none that trains
        from primus.core.launch.dist_env import get_torchrun_env, under_torchrun
        from primus.core.launch.launcher import LAUNCHER_PID
        from primus.core.launch.workers import launch_workers, load_launcher
        from primus.core.runtime import PrimusRuntime

        if full and not dry_run:
            raise typer.BadParameter("builds a dry run's args: give it with --dry-run",
                                     param_hint="--full")  # fmt: skip
        several = (nproc_per_node > 1 or nnodes > 1) and not under_torchrun()
        # a dry run checks the layout as the launch does
        launch = checked_launch(nproc_per_node, nnodes, node_rank, master_addr, master_port)
        launching = several and not dry_run
        if not launching and not dry_run:  # this process trains
            from primus.core.launch import helper_processes, reaper

            helper_processes.shield()
            if LAUNCHER_PID not in os.environ:  # else the launcher's discipline holds
                reaper.start_descendant_reaper()
        overrides = list(ctx.args)
        # fails fast: the workspace and the inputs are checked before the upstream is imported,
        # once: a Primus launcher's workers do not read every input again
        checked = LAUNCHER_PID in os.environ
        runtime = PrimusRuntime(
            config, overrides, stage, module, debug=DEBUG.on, check_inputs=not checked
        )
        if several:
            how = f"--nnodes {nnodes} x --nproc-per-node {nproc_per_node}"
            runtime.check_world(nproc_per_node * nnodes, how)
        elif not dry_run and not checked:  # one process, or one rank of someone's torchrun
            world = get_torchrun_env().world_size
            runtime.check_world(world, "WORLD_SIZE" if under_torchrun() else "no --nproc-per-node")
        if launching:
            preemption.clear(runtime.run_dir)
            worker = [
                "train",
                stage,
                "--config",
                str(Path(config).resolve()),
                *(["--module", module] if module else []),
                *(["--debug"] if DEBUG.on else []),
                *overrides,
            ]
            # Signalled already: alone, start no worker. With other nodes, start them anyway:
            # they learn of the signal and stop before their first step with the other nodes'
            # (a node that started none would leave theirs waiting at the rendezvous).
            if not (preemption.requested() and nnodes == 1):
                load_launcher(runtime.adapter.launcher)  # seconds: a signal meanwhile counts too
            if preemption.requested() and nnodes == 1:
                preemption.mark(runtime.run_dir, None, None)  # a Slurm job requeues on it
                print(
                    f"[primus] preempted by {preemption.requested()} before the workers started; "
                    "run the same command again",
                    file=sys.stderr,
                )
                raise typer.Exit(preemption.EXIT_PREEMPTED)
            code = launch_workers(runtime.adapter.launcher, worker, launch)
            # A worker stopped because another failed marks the run too: that is no preemption.
            preempted = code == preemption.EXIT_PREEMPTED or preemption.requested()
            if code != 0 and preempted:
                code = _say_preempted(runtime.run_dir, code, other_nodes=nnodes > 1)
            raise typer.Exit(code)
        runtime.run(dry_run=dry_run, full=full)

    command.__doc__ = f"Run the {stage} stage of an experiment. Overrides may follow the options."
    return command


EPILOG = (
    "Overrides follow the options: key=value, --key value or --key=value; dotted keys reach "
    "nested params (optimizer.lr=1e-4); values are typed as YAML (1e-4 is a float, [1,2] a "
    "list); dashes become underscores. They beat every file (see primus config show "
    "--provenance). Under torchrun, --nproc-per-node and the node flags are ignored."
)
for _stage in ("pretrain", "posttrain"):
    app.command(_stage, cls=OverridesCommand, context_settings=OVERRIDES, epilog=EPILOG)(
        _command(_stage)
    )


def _say_preempted(run_dir: Path, code: int, other_nodes: bool) -> int:
    """Say where the preempted workers stopped (the run dir's mark) and return 75; `code` when
    the run was not preempted after all. Rank 0 marks the run after the last barrier, so the
    launcher of another node may see its workers end first: it waits a little for the mark,
    also when it was signalled itself (torchrun then reports the signal, not the workers' 75)."""
    from primus.core.reliability import preemption

    saved = code == preemption.EXIT_PREEMPTED
    wait = saved or (other_nodes and preemption.requested() is not None)
    mark = preemption.marked(run_dir) or (wait and preemption.wait_marked(run_dir, 10.0))
    if not mark:
        if saved:  # a node that does not share the run dir
            print(
                f"[primus] preempted by {preemption.requested() or 'a stop signal'}: the "
                "workers stopped (exit 75); run the same command again to resume",
                file=sys.stderr,
            )
        return code
    where = (
        "before the first step"
        if mark["step"] is None
        else f"at step {mark['step']}; checkpoint {mark['checkpoint']}"
    )
    print(
        f"[primus] preempted by {mark['signal']} {where}; run the same command again to resume",
        file=sys.stderr,
    )
    return preemption.EXIT_PREEMPTED
