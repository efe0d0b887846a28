"""Multi-node runs of each backend's tiny CPU recipe on one host: two Primus launchers with
`--nnodes 2` on 127.0.0.1, and a 2-node job through `primus slurm` on a real Slurm (the
`slurm` fixture). Both give the losses of the same run with `--nproc-per-node 2`, step for
step. A backend's three runs go side by side, to keep the wall time down; the one-launcher run
is the one its backend's two-process test in test_training.py reads (`shared_train_run`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from primus.core.launch.ports import free_port
from primus.core.reliability.preemption import EXIT_PREEMPTED
from primus.testing.runs import losses, primus
from primus.testing.shared import shared_train_run
from primus.testing.slurm import exit_code, wait_for

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).parents[1] / "configs"
DUMMY_QUICKSTART = Path(__file__).parent / "fixtures" / "dummy-quickstart.yaml"
# The settings of each backend's two-process test (test_training.py): the same, so that the
# one-launcher reference is that test's run, made once per session.
RUNS = {
    "megatron": ("train_iters=12",),
    "torchtitan": (
        "lr_scheduler.total_steps=20",
        "metrics.log_freq=1",
        "training.steps=12",
        "parallelism.data_parallel_shard_degree=2",
    ),
    "maxtext": ("learning_rate_schedule_steps=20", "steps=12"),
}
# JAX's gloo context waits 30 s at most for a peer: on the 2-core CI machine, with a backend's
# three two-process runs side by side, a MaxText process fell behind that and the run failed.
# Its runs go one after another.
ONE_AT_A_TIME = {"maxtext"}


def _start(
    workspace: Path, name: str, *args: str, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    """A Primus command and the log it writes: a pipe nobody reads until the runs before it
    end would fill up and stall a worker (then JAX's shutdown barrier times out)."""
    log = workspace / f"{name}.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "primus.cli", *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return run, log


def _finish(run: subprocess.Popen[str], log: Path) -> None:
    run.wait(timeout=600)
    assert run.returncode == 0, f"{run.args} exited {run.returncode}:\n{log.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def runs(
    slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Path]]:
    """Every backend's three runs side by side (one CPU per Slurm job, so that the job shares
    the two nodes; MaxText's one after another, ONE_AT_A_TIME), one backend at a time: with
    all nine at once on a 2-core CI machine, a MaxText process fell more than 30 s behind its
    peer and gloo's context setup timed out.
    The one-launcher reference is shared with test_training.py: made here unless made there.
    backend -> run dirs `reference`, `nodes`, `slurm`."""
    dirs = {}
    for backend, overrides in RUNS.items():
        recipe = CONFIGS / backend / "tiny-cpu.yaml"
        workspace = tmp_path_factory.mktemp(backend)
        parent = workspace / "local" / "local"
        env = {**slurm, "PRIMUS_WORKSPACE": str(workspace)}
        train = ("train", "pretrain", "--config", str(recipe), *overrides)
        with ThreadPoolExecutor(1) as pool:
            reference = pool.submit(shared_train_run, tmp_path_factory, recipe, *overrides, nproc=2)
            if backend in ONE_AT_A_TIME:
                reference.result()
            port = str(free_port())
            started = [
                _start(workspace, f"nodes-{rank}", *train, "--nnodes", "2", "--node-rank",
                       str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
                       "exp_name=nodes", **env)
                for rank in (0, 1)
            ]  # fmt: skip
            if backend in ONE_AT_A_TIME:
                for run, log in started:
                    _finish(run, log)
            submitted = primus(
                "slurm", "pretrain", "--config", str(recipe), "--nnodes", "2", "--gpus-per-node",
                "0", "--cpus-per-node", "1", *overrides, "exp_name=slurm", **env,
            )  # fmt: skip
            assert submitted.returncode == 0, submitted.stderr[-3000:]
            job = submitted.stdout.split()[2].rstrip(":")  # "submitted job 7: <script>"
            for run, log in started:
                _finish(run, log)
            wait_for(job, slurm)
            log = parent / "slurm" / "logs" / f"slurm-{job}.out"
            assert exit_code(job, slurm) == 0, log.read_text()[-3000:]
            dirs[backend] = {
                "reference": reference.result(),
                "nodes": parent / "nodes",
                "slurm": parent / "slurm",
            }
    return dirs


@pytest.mark.parametrize("backend", list(RUNS))
def test_two_launchers_on_one_host_match_one_launcher_of_two(
    runs: dict[str, dict[str, Path]], backend: str
) -> None:
    assert losses(runs[backend]["nodes"]) == losses(runs[backend]["reference"])


@pytest.mark.parametrize("backend", list(RUNS))
def test_a_two_node_slurm_job_matches_one_launcher_of_two(
    runs: dict[str, dict[str, Path]], backend: str
) -> None:
    slurm = losses(runs[backend]["slurm"])
    assert slurm == losses(runs[backend]["reference"])
    assert len(slurm) >= 11


def show(job: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", job], env=env, capture_output=True, text=True
    ).stdout


def test_the_time_limit_warning_stops_the_job_with_a_checkpoint_and_requeue_resumes(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    """A 2-minute job with `--warn 90`: Slurm's SIGUSR1 (`--signal=USR1@90`) reaches the
    workers of both nodes, once they train (30 s in), which save and exit 75, and with
    --requeue the job is requeued."""
    env = {**slurm, "PRIMUS_WORKSPACE": str(tmp_path)}
    submitted = primus(
        "slurm", "pretrain", "--config", str(DUMMY_QUICKSTART), "--nnodes", "2",
        "--gpus-per-node", "0", "--time", "2", "--warn", "90", "--requeue",
        "train_iters=1000000000", "log_interval=1000000000", **env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    job = submitted.stdout.split()[2].rstrip(":")
    log = tmp_path / "local" / "local" / "quickstart" / "logs" / f"slurm-{job}.out"
    deadline = time.monotonic() + 120
    while "Restarts=1" not in show(job, slurm):
        assert time.monotonic() < deadline, log.read_text() if log.is_file() else "no log"
        time.sleep(1)
    subprocess.run(["scancel", job], env=slurm, check=True)
    text = log.read_text()
    # each node's launcher: its worker stopped at a step with a checkpoint (or, when the warning
    # came during set-up, before the first step or before starting it)
    said = re.findall(r"\[primus\] preempted by SIGUSR1 .*; run the same command again", text)
    assert len(said) == 2, text[-3000:]
    assert f"Exited with exit code {EXIT_PREEMPTED}" in text
    assert "[primus] preempted: requeueing job" in text
