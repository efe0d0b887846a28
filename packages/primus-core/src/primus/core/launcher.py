"""Starting worker processes through torch.distributed.run (torchrun), imported only here."""

from __future__ import annotations

import socket
import sys

from primus.core.errors import PrimusError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_args(
    worker_argv: list[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[str]:
    """torchrun's arguments to run `python -m primus.cli <worker_argv>` in every worker."""
    addr = master_addr or "127.0.0.1"
    port = master_port or (free_port() if nnodes == 1 else 29500)
    return [
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--master-addr={addr}",
        f"--master-port={port}",
        "-m",
        "primus.cli",
        *worker_argv,
    ]


def launch(args: list[str]) -> int:
    """Run torchrun in this process; return 0, or 1 when a worker failed."""
    try:
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except ImportError:
        raise PrimusError(
            "starting several workers needs PyTorch, which is not installed",
            hint="pip install torch (or the backend package, which brings it)",
        ) from None
    print(f"[primus] torchrun {' '.join(args)}", file=sys.stderr)
    try:
        torchrun.main(args)
    except ChildFailedError as exc:
        print(f"[primus] a worker failed:\n{exc.format_msg()}", file=sys.stderr)
        return 1
    return 0
