"""No orphans, with real signals to real processes: a launcher killed by
SIGKILL (started directly or through `uv run`) leaves no worker behind, and a worker that dies
under torchrun stops the others in bounded time, named by rank and exit code."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus.core.launch.torchrun import run_torchrun
from primus.testing.faults import descendants
from primus.testing.processes import left_alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's"),
]

ROOT = Path(__file__).parents[1]
DUMMY_QUICKSTART = ROOT / "tests" / "fixtures" / "dummy-quickstart.yaml"


def is_worker(pid: int) -> bool:
    try:
        return b"primus.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def left_after(sig: signal.Signals, prefix: list[str], tmp_path: Path) -> list[int]:
    """Start a two-worker dummy run (torchrun) under `prefix`, send `sig` to the process started
    once both workers run, and return the processes of the run still alive 10 s later."""
    command = [
        *prefix, "train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}",
        "--nproc-per-node", "2", "train_iters=1000000000", "log_interval=1000000000",
    ]  # fmt: skip
    top = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    run: list[int] = []
    while time.monotonic() < deadline:
        run = descendants(top.pid)
        if sum(map(is_worker, run)) >= 2:
            break
        time.sleep(0.2)
    assert sum(map(is_worker, run)) >= 2, "the workers did not start"
    top.send_signal(sig)
    top.wait(timeout=60)
    return left_alive(run)


def test_sigkill_to_the_launcher_leaves_no_worker(tmp_path: Path) -> None:
    assert left_after(signal.SIGKILL, [sys.executable, "-m", "primus.cli"], tmp_path) == []


UV = shutil.which("uv")


@pytest.mark.skipif(UV is None, reason="needs uv")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_signal_to_uv_run_leaves_no_worker(tmp_path: Path, sig: signal.Signals) -> None:
    """`uv run primus train ...`: uv forwards SIGTERM; on SIGKILL to uv, the launcher's death
    signal (set because its parent is uv) stops it, and it stops the workers."""
    assert left_after(sig, [str(UV), "run", "--no-sync", "primus"], tmp_path) == []


def test_a_dead_worker_stops_the_others_and_is_named(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, sys, time\nsys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)\n"
    )
    start = time.monotonic()
    assert run_torchrun(["--nproc-per-node=2", "--master-port=0", str(script)]) == 1
    assert time.monotonic() - start < 30
    assert "a worker failed: rank 1 exited with code 3" in capfd.readouterr().err
