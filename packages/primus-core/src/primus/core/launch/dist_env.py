"""Rank, world size and master address: from torchrun's environment, else Slurm's."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from primus.core.launch.ports import free_port


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    def export(self) -> None:
        """Set the env:// rendezvous variables that are not set yet (Slurm, or a lone process).

        A lone process not started by a launcher gets a free port, so that runs side by side
        do not collide.
        """
        port = self.master_port
        if self.world_size == 1 and "MASTER_PORT" not in os.environ:
            port = free_port()
        values = {
            "RANK": self.rank,
            "WORLD_SIZE": self.world_size,
            "LOCAL_RANK": self.local_rank,
            "LOCAL_WORLD_SIZE": self.local_world_size,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": port,
        }
        for name, value in values.items():
            os.environ.setdefault(name, str(value))


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, ranges = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def get_torchrun_env() -> DistEnv:
    env = os.environ
    if "RANK" in env or under_torchrun():
        return DistEnv(
            int(env.get("RANK", 0)),
            int(env.get("WORLD_SIZE", 1)),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", 1)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
        )
    if "SLURM_PROCID" in env:
        return DistEnv(
            int(env["SLURM_PROCID"]),
            int(env.get("SLURM_NTASKS", 1)),
            int(env.get("SLURM_LOCALID", 0)),
            int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]),
            env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")),
            int(env.get("MASTER_PORT", 29500)),
        )
    return DistEnv()
