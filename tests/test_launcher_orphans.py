"""No orphans, with real signals to real processes: a launcher killed by
SIGKILL (started directly or through `uv run`) leaves no worker behind, and a worker that dies
under torchrun stops the others in bounded time, named by rank and exit code; the others, whose
collectives fail for it, say so in one line."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus.core.launch.launcher import peer_gone
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


# A worker through Primus's CLI: rank 1 dies (SIGKILL) between two collectives, and rank 0's
# gloo all-reduce fails for it (`Connection reset by peer`).
PEER_DIES = """
import os, signal, sys, torch, torch.distributed as dist
import primus.cli.main as cli

def train(**_):
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.zeros(1))

cli._command = lambda: train
cli.main([])
"""

LAUNCHERS = {  # poll_s: the spawner sees both workers ended in one look
    "torchrun": "from primus.core.launch.torchrun import run_torchrun; sys.exit(run_torchrun(["
    "'--nproc-per-node=2', f'--master-port={{free_port()}}', {script!r}, {folder!r}], "
    "signals_held=True))",
    "spawn": "from primus.core.launch.spawner import spawn; from primus.core.launch.launcher "
    "import Launch; sys.exit(spawn([sys.executable, {script!r}, {folder!r}], "
    "Launch(2, master_port=free_port()), poll_s=1.0, signals_held=True))",
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_ranks_a_dead_rank_leaves_in_a_collective_stop_without_a_traceback(
    tmp_path: Path, launcher: str
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(PEER_DIES)
    program = "import sys; from primus.core.launch.ports import free_port; " + LAUNCHERS[
        launcher
    ].format(script=str(script), folder=str(tmp_path))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert time.monotonic() - start < 60
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "[primus] rank 0 stopped: another rank ended first (RuntimeError: " in done.stderr
    assert "[primus] a worker failed: rank 1 was killed by SIGKILL" in done.stderr
    if launcher == "torchrun":
        assert "[primus] rank 0 stopped (SIGTERM) when another rank ended" in done.stderr
    pids = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
    assert len(pids) == 2 and left_alive(pids, timeout_s=5) == []


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer"), True),
        (RuntimeError("NCCL communicator was aborted on rank 0"), True),
        (ValueError("loss is nan at step 3"), False),
        (FileNotFoundError(2, "No such file or directory", "data.bin"), False),
    ],
)
def test_only_a_collective_whose_peer_is_gone_is_told_as_another_ranks_end(
    error: BaseException, gone: bool
) -> None:
    """A worker's own failure keeps its message even when another worker has ended."""
    assert peer_gone(error) is gone
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = error
    assert peer_gone(wrapped) is gone
    assert peer_gone(ExceptionGroup("the ranks failed", [ValueError("a"), error])) is gone
