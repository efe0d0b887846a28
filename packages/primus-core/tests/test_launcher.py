"""Primus's own spawner (the `spawn` launcher): torchrun's variables, no torch, fail fast."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.errors import PrimusError
from primus.core.launcher import launch_workers, spawn, worker_env

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_worker_env_is_torchruns() -> None:
    assert worker_env(1, 4, nnodes=2, node_rank=1, addr="h0", port=9) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "9",
    }


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_each_worker_gets_its_rank_and_a_shared_free_port(tmp_path: Path) -> None:
    dump = f"import json, os; json.dump({{k: os.environ[k] for k in {VARIABLES!r}}}, open({str(tmp_path)!r} + '/' + os.environ['RANK'], 'w'))"
    assert spawn(python(dump), 3, nnodes=2, node_rank=1) == 0
    seen = [json.loads((tmp_path / str(rank)).read_text()) for rank in (3, 4, 5)]
    assert [(s["RANK"], s["LOCAL_RANK"]) for s in seen] == [("3", "0"), ("4", "1"), ("5", "2")]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {
        ("6", "3", "127.0.0.1")
    }
    assert {s["MASTER_PORT"] for s in seen} == {"29500"}  # several nodes: the default port
    assert spawn(python("pass"), 2, master_port=None) == 0  # one node: a free port


def test_one_failing_worker_stops_the_others(capfd: pytest.CaptureFixture[str]) -> None:
    code = "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)"
    start = time.monotonic()
    assert spawn(python(code), 2, grace_s=2) == 1
    assert time.monotonic() - start < 30
    assert (
        "a worker failed: rank 1 exited with code 3; stopping the others" in capfd.readouterr().err
    )


class MpiAdapter(BackendAdapter):
    launcher = "mpirun"

    def convert_config(self, config: Any) -> None: ...

    def load_trainer_class(self, stage: str = "pretrain") -> Any: ...


def test_an_unknown_launcher_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"MpiAdapter\.launcher must be one of torchrun, spawn"):
        BackendRegistry.register_adapter("mpi", MpiAdapter)  # checked when registered
    with pytest.raises(PrimusError, match="unknown launcher 'mpirun'"):
        launch_workers("mpirun", ["train"], 2)
