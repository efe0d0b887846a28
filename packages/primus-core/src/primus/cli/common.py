"""Options and state shared by the subcommands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from primus.core.launch.launcher import Launch


class _Debug:
    on = False


DEBUG = _Debug()

# Overrides (key=value, --key value) arrive as extra arguments.
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}

ConfigFile = Annotated[
    Path, typer.Option("--config", "-c", help="The experiment YAML.", show_default=False)
]
Module = Annotated[
    str | None, typer.Option("--module", help="The module to use when the experiment has several.")
]


def debug_option(value: bool) -> None:
    if value:
        DEBUG.on = True


Debug = Annotated[
    bool,
    typer.Option("--debug", callback=debug_option, help="Show tracebacks and log at DEBUG level."),
]


def output_file(value: Path | None) -> Path | None:
    """An option naming a file the command writes at its end: refused at once (a usage
    error) where no folder holds it, not after the work."""
    from primus.core.folders import not_a_file

    why = not_a_file(value) if value is not None else None
    if why is not None:
        raise typer.BadParameter(f"cannot write {value}: {why}")
    return value


# Where workers start, as torchrun takes it (primus train, primus preflight).
NprocPerNode = Annotated[
    int,
    typer.Option(
        "--nproc-per-node",
        min=1,
        help="Worker processes on this node (via torchrun, or the backend's launcher).",
    ),
]
Nnodes = Annotated[int, typer.Option("--nnodes", min=1, help="Number of nodes.")]
NodeRank = Annotated[int, typer.Option("--node-rank", min=0, help="This node's rank.")]
MasterAddr = Annotated[
    str | None, typer.Option("--master-addr", help="Rendezvous host (default: this host).")
]
MasterPort = Annotated[
    int | None,
    typer.Option(
        "--master-port", min=1, max=65535, help="Rendezvous port (default: a free one on one node)."
    ),
]


def checked_launch(
    nproc_per_node: int, nnodes: int, node_rank: int, master_addr: str | None,
    master_port: int | None,
) -> Launch:  # fmt: skip
    """The launch the options describe; usage errors for a node rank past the nodes, several
    nodes without node 0's address, or an address that is no host name or IP address."""
    from primus.core.launch.launcher import Launch

    # no leading `-`: a launcher would read the address as an option
    if master_addr is not None and not re.fullmatch(r"[\w.:%\[\]][\w.:%\[\]-]*", master_addr,
                                                    re.ASCII):  # fmt: skip
        raise typer.BadParameter(
            f"{master_addr!r} is not a host name or an IP address", param_hint="--master-addr"
        )
    if nnodes > 1 and not master_addr:
        raise typer.BadParameter(
            "several nodes need the address of node 0", param_hint="--master-addr"
        )
    if node_rank >= nnodes:
        raise typer.BadParameter(
            f"{node_rank} is not below --nnodes {nnodes}", param_hint="--node-rank"
        )
    return Launch(nproc_per_node, nnodes, node_rank, master_addr, master_port)
