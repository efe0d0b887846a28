"""Rank and address from torchrun's or Slurm's environment; the torchrun command we build."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.core.launch.dist_env import DistEnv, first_slurm_host, get_torchrun_env
from primus.core.launch.launcher import Launch
from primus.core.launch.torchrun import torchrun_args

ALL = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ALL:  # set, then delete: monkeypatch restores the original state afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_single_process_defaults() -> None:
    assert get_torchrun_env() == DistEnv()


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "1234",
    "SLURM_PROCID": "7",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "16",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS_PER_NODE": "8(x2)",
    "SLURM_JOB_NODELIST": "gpu[003-004,9]",
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TORCHRUN, DistEnv(3, 8, 1, 2, "node0", 1234)),  # torchrun's wins over Slurm's
        (SLURM, DistEnv(5, 16, 1, 8, "gpu003", 29500)),  # Slurm's when torchrun's is absent
    ],
)
def test_environment(monkeypatch, env, expected) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert get_torchrun_env() == expected


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu[003-005,9],cpu1", "gpu003"), ("node7", "node7"), ("a1,b2", "a1"), ("n[12]", "n12")],
)
def test_first_slurm_host(nodelist, host) -> None:
    assert first_slurm_host(nodelist) == host


def test_torchrun_args() -> None:
    args = torchrun_args(["train", "pretrain"], Launch(4, 2, 1, "h0", 9))
    assert args == [
        "--nproc-per-node=4",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=h0",
        "--master-port=9",
        "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "--shutdown-timeout=120",
        "-m",
        "primus.cli",
        "train",
        "pretrain",
    ]
    single = torchrun_args(["x"], Launch(2))
    assert single[3] == "--master-addr=127.0.0.1" and int(single[4].split("=")[1]) > 0


def test_an_older_torchrun_gets_no_shutdown_timeout(monkeypatch) -> None:
    """torch 2.11 (the GPU machines' image) has no --shutdown-timeout, and every launch there
    failed on it. The lock's torch has the option, so its parser is narrowed here: a mock,
    because an older torch cannot be installed beside the lock's."""
    from primus.core.launch import torchrun

    older = torchrun.torchrun_options() - {"--shutdown-timeout"}
    monkeypatch.setattr(torchrun, "torchrun_options", lambda: older)
    args = torchrun_args(["train"], Launch(2))
    assert not [a for a in args if a.startswith("--shutdown-timeout")]
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in args


def test_export_fills_the_rendezvous_for_a_lone_process_with_a_free_port() -> None:
    import os
    import socket

    DistEnv().export()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]) == (
        "0",
        "1",
        "127.0.0.1",
    )
    port = int(os.environ["MASTER_PORT"])
    with socket.socket() as probe:  # the chosen port is free to bind
        probe.bind(("127.0.0.1", port))
    # below the ephemeral range, which gloo's connections and port-0 binds draw from
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 1024 <= port < low


def test_export_keeps_what_the_launcher_set(monkeypatch) -> None:
    import os

    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[007-008]")
    monkeypatch.setenv("MASTER_PORT", "6000")
    get_torchrun_env().export()
    assert os.environ["RANK"] == "3" and os.environ["WORLD_SIZE"] == "8"
    assert os.environ["MASTER_ADDR"] == "gpu007" and os.environ["MASTER_PORT"] == "6000"
