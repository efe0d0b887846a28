"""`primus preflight`: check the job's nodes and GPUs before a long run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import (
    DEBUG,
    Debug,
    MasterAddr,
    MasterPort,
    Nnodes,
    NodeRank,
    NprocPerNode,
    checked_launch,
)


def preflight(
    workspace: Annotated[
        Path,
        typer.Option(
            "--workspace",
            help="Where the disk probe writes (a temporary file) and relative report paths go.",
        ),
    ] = Path("."),
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance", help="Percent below the job's median at which a rank is an outlier."
        ),
    ] = 20.0,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON here.")
    ] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write the report as Markdown here.")
    ] = None,
    node_smoke: Annotated[
        bool,
        typer.Option(
            "--node-smoke",
            help="Check this node alone, no rendezvous: each GPU in a process of its own "
            "(allocate, copy, a GEMM checked finite), shared and locked memory, processes left "
            "on the GPUs. Run it on every node (srun --ntasks-per-node 1).",
        ),
    ] = False,
    nodes_ok: Annotated[
        Path | None,
        typer.Option("--nodes-ok", help="--node-smoke: append this node's name here if it passes."),
    ] = None,
    nodes_bad: Annotated[
        Path | None,
        typer.Option("--nodes-bad", help="--node-smoke: append this node's name here if it fails."),
    ] = None,
    device_timeout: Annotated[
        float,
        typer.Option(
            "--device-timeout",
            help="--node-smoke: seconds a device may take (1 to 86400: at most a day).",
        ),
    ] = 300.0,
    nproc_per_node: NprocPerNode = 1,
    nnodes: Nnodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    debug: Debug = False,
) -> None:
    """Check every rank of a job before a long run: GPUs (model, memory, CUDA), host memory and
    CPU, the workspace's free disk and write speed, GEMM TFLOP/s, and the all-reduce and
    all-gather bus bandwidth over all ranks. Each rank's GEMM and each node's disk speed are
    compared with the job's median; rank 0 prints one table for the job and names the outliers.
    Launched like `primus train` (torchrun options, or one task a rank under Slurm's srun).
    Exit code: 0 pass, 1 an outlier or a failed worker, 2 bad input."""
    from primus.core.diagnostics.preflight import check_workspace, run
    from primus.core.diagnostics.preflight_report import render_markdown, render_table, verdict
    from primus.core.errors import ConfigError
    from primus.core.folders import not_a_file
    from primus.core.launch.dist_env import under_torchrun
    from primus.core.launch.workers import launch_workers
    from primus.core.reliability.atomic import write_atomic, write_json

    if not 0 <= tolerance < 100:  # NaN included
        raise ConfigError(f"--tolerance {tolerance:g} is not a percentage in [0, 100)")
    if not 1 <= device_timeout <= 86400:  # NaN included (typer's range said "<= 86400")
        raise ConfigError(f"--device-timeout {device_timeout:g} is not a number of seconds "
                          "in [1, 86400]")  # fmt: skip
    launch = checked_launch(nproc_per_node, nnodes, node_rank, master_addr, master_port)
    for flag, given in (("--nodes-ok", nodes_ok), ("--nodes-bad", nodes_bad)):
        if given is not None and not node_smoke:
            raise typer.BadParameter("is a node list of --node-smoke: give it with that",
                                     param_hint=flag)  # fmt: skip
    workspace = check_workspace(workspace)
    for output in filter(None, (json_path, markdown_path, nodes_ok, nodes_bad)):
        if why := not_a_file(workspace / output):  # refused before the checks run
            raise ConfigError(f"cannot write {workspace / output}: {why}",
                              hint="name a file in a folder that exists")  # fmt: skip
    if node_smoke:
        if nproc_per_node > 1 or nnodes > 1 or markdown_path:
            raise ConfigError(
                "--node-smoke checks this node alone: no --nproc-per-node, --nnodes or --markdown",
                hint="run it once on each node (srun --ntasks-per-node 1 primus preflight ...)",
            )
        raise typer.Exit(_node_smoke(workspace, json_path, nodes_ok, nodes_bad, device_timeout))
    if (nproc_per_node > 1 or nnodes > 1) and not under_torchrun():
        worker = ["preflight", "--workspace", str(workspace), "--tolerance", str(tolerance)]
        for flag, path in (("--json", json_path), ("--markdown", markdown_path)):
            worker += [flag, str(workspace / path)] if path else []
        worker += ["--debug"] if DEBUG.on else []
        raise typer.Exit(launch_workers("torchrun", worker, launch))
    gathered = run(workspace)
    if gathered is None:  # not rank 0
        return
    report = verdict(*gathered, tolerance_pct=tolerance)
    typer.echo(render_table(report), nl=False)
    if json_path:
        write_json(workspace / json_path, report)
    if markdown_path:
        write_atomic(workspace / markdown_path, render_markdown(report))
    raise typer.Exit(0 if report["passed"] else 1)


def _node_smoke(
    workspace: Path, json_path: Path | None, ok: Path | None, bad: Path | None, timeout_s: float
) -> int:
    """`--node-smoke`: this node's report printed (and written), its name listed; 0 or 1."""
    from primus.core.diagnostics.node_smoke import check_node, record, render
    from primus.core.reliability.atomic import write_json

    report = check_node(timeout_s)
    typer.echo(render(report), nl=False)
    if json_path:
        write_json(workspace / json_path, report)
    record(report, ok and workspace / ok, bad and workspace / bad)
    return 0 if report["passed"] else 1
