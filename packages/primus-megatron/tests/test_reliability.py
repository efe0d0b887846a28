"""Reliability of `primus train` on Megatron, on CPU: real signals to real
processes, real NaN/Inf in real training steps.

Every run is `primus train pretrain` on the tiny recipe (gloo for 2 processes): a subprocess
where signals, several ranks or a killed process are under test, else in the test process
(`primus.testing.in_process`: torch and Megatron are imported once).
Non-finite steps are made by the test-only patch `megatron.fault_nonfinite`, which the test
selects with PRIMUS_FAULT_NONFINITE: at the chosen steps it multiplies the loss by NaN (`loss`),
or leaves the loss finite and multiplies the gradient flowing back from it by Inf (`grad`).
Saves are interrupted by SIGKILL at random moments; the samples of each step are logged by the
test-only patch `megatron.log_samples` (PRIMUS_LOG_SAMPLES).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from primus.testing import runs
from primus.testing.checkpoints import dcp_state
from primus.testing.faults import PYTHON, UV, UV_RUN, Forks, interrupt
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import losses, primus, step_metrics, train_run

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "megatron" / "tiny-cpu.yaml"
STEPS = 28  # the crash test needs about 2 steps per kill
KILLS = 12  # in CHAINS experiments side by side
CHAINS = 2
# what the killed runs' fork server imports once
MEGATRON = (
    "megatron.training.training",
    "megatron.training.checkpointing",
    "megatron.core.models.gpt",
)
pytestmark = pytest.mark.slow


def command(name: str, *overrides: str, nproc: int = 1) -> list[str]:
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    return ["train", "pretrain", "--config", str(RECIPE), *launch, f"exp_name={name}", *overrides]


def env(workspace: Path) -> dict[str, str]:
    """The run dir is then workspace/team/user/exp_name."""
    return {"PRIMUS_WORKSPACE": str(workspace), "PRIMUS_TEAM": "team", "PRIMUS_USER": "user"}


def here(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """`primus ARGS` of one process in the test process (exit code and stderr)."""
    with in_process():
        return primus_here(*args, **environment)


def train_here(*overrides: str, workspace: Path) -> Path:
    """`train_run` of the recipe in the test process: its run directory."""
    with in_process(runs):
        return train_run(RECIPE, workspace, *overrides)


def tracked(run_dir: Path) -> int:
    """The iteration Megatron's tracker file names: the checkpoint a resume loads."""
    return int((run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())


def tensors(checkpoint: Path, out: Path) -> dict[str, object]:
    """The model and optimizer tensors of a Megatron (torch_dist) checkpoint folder, by name
    (`optimizer.state.exp_avg.<param>` and so on)."""
    import torch

    return {k: v for k, v in dcp_state(checkpoint, out).items() if isinstance(v, torch.Tensor)}


def assert_same_tensors(a: dict[str, object], b: dict[str, object]) -> None:
    import torch

    assert a.keys() == b.keys() and len(a) > 20
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_here(
        "exp_name=whole", f"train_iters={STEPS}", workspace=tmp_path_factory.mktemp("ws")
    )


# preemption.


Stop = tuple[signal.Signals, int | str | None, list[str]]  # signal, to whom, how primus starts


@pytest.mark.parametrize(
    ("nproc", "stops"),
    [
        (1, [(signal.SIGINT, None, UV_RUN)]),
        (2, [(signal.SIGTERM, "everyone", UV_RUN), (signal.SIGUSR1, 1, PYTHON)]),
    ],
    ids=["SIGINT-to-uv-run", "SIGTERM-to-every-process-under-uv-run-then-SIGUSR1-to-rank-1-of-2"],
)
def test_a_preempted_run_saves_its_step_exits_75_and_resumes_the_same_curve(
    tmp_path: Path, uninterrupted: Path, nproc: int, stops: list[Stop]
) -> None:
    """Each stop: the run (with its data-loader workers) ends after a step with exit 75 and a
    checkpoint of that step; the same command resumes it. The curve is the uninterrupted
    run's: bit for bit in one process, within 1e-5 over two (another reduction order)."""
    if UV is None:
        pytest.skip("needs uv")
    name = f"preempted-{nproc}"
    run, run_dir = command(name, f"train_iters={STEPS}", nproc=nproc), tmp_path / "team/user" / name
    stopped_at: list[int] = []
    for sig, to, prefix in stops:
        at = stopped_at[-1] + 4 if stopped_at else 4
        stopped = interrupt(run, run_dir, sig, at_step=at, to_rank=to, prefix=prefix, env=env(tmp_path))  # fmt: skip
        assert stopped.preempted, stopped.stderr[-4000:]
        assert stopped.left == []  # every process the run started ended with it
        step = stopped.marker["step"]
        assert at <= step < STEPS - 2
        assert stopped.marker["signal"] == sig.name  # rank 0 names it, got or agreed on
        assert (
            f"at step {step}" in stopped.stderr and "run the same command again" in stopped.stderr
        )
        assert (
            tracked(run_dir) == step
        )  # no save_interval: the preemption saved it, where load looks
        assert max(losses(run_dir)) == step
        signalled = to if isinstance(to, int) else 0  # the launcher passes it on to every rank
        for rank in range(
            nproc
        ):  # every rank stopped at the same step, the signalled one knows why
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            assert f" at step {step}; checkpoint {run_dir / 'checkpoints'}" in log
            assert rank != signalled or f"preempted by {sig.name}" in log
        if stopped_at:  # this run resumed the last one
            resumed_from = run_dir / "checkpoints" / f"iter_{stopped_at[-1]:07d}"
            assert f"resumed from {resumed_from}" in (run_dir / "logs" / "rank-0.log").read_text()
        stopped_at.append(step)

    resume = here if nproc == 1 else primus  # the same command again: one process, or two
    resumed = resume(*run, **env(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    step = stopped_at[-1]
    assert f"resumed from {run_dir / 'checkpoints' / f'iter_{step:07d}'} (iteration {step})" in log
    steps = [m["step"] for m in step_metrics(run_dir)]
    firsts = {1} | {s + 1 for s in stopped_at}  # the first step of a run only starts the clock
    assert steps == [s for s in range(1, STEPS + 1) if s not in firsts]
    whole, curve = losses(uninterrupted), losses(run_dir)
    for s in steps:
        if nproc == 1:
            assert curve[s] == whole[s], s
        else:
            assert curve[s] == pytest.approx(whole[s], rel=1e-5, abs=1e-5), s


def test_megatrons_own_sigterm_handler_is_left_to_primus(tmp_path: Path) -> None:
    # exit_signal_handler would replace Primus's handler for one signal, and exit 0.
    shown = primus(
        "config", "show", str(RECIPE), "--provenance", "--after-patches",
        "exit_signal_handler=true", PRIMUS_WORKSPACE=str(tmp_path),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "exit_signal_handler: false  # patch megatron.exit_signal_handler_off" in shown.stdout
    assert "check_for_nan_in_loss_and_grad: false  # patch megatron.nonfinite_args" in shown.stdout


# non-finite numbers.


def test_a_transient_nan_loss_skips_the_steps_and_keeps_the_weights(tmp_path: Path) -> None:
    # A NaN loss at steps 5 and 6 (NaN gradients as well): 2 in a row, under the default 3.
    faulty = here(
        *command("nan", "train_iters=12", "save_interval=2"),
        PRIMUS_FAULT_NONFINITE="loss:5,6", **env(tmp_path),
    )  # fmt: skip
    assert faulty.returncode == 0, faulty.stderr[-4000:]
    run_dir = tmp_path / "team/user/nan"
    log = (run_dir / "logs" / "rank-0.log").read_text()
    for step, in_row in ((5, 1), (6, 2)):
        assert (
            f"step {step} skipped: loss is nan, grad norm is nan; {in_row} in a row "
            "(max_skipped_steps 3)" in log
        )
    assert log.count(" skipped: ") == 2
    # The skipped steps kept the weights and the optimizer state; the next step trained.
    ckpt = run_dir / "checkpoints"
    before, after = (tensors(ckpt / f"iter_{i:07d}", tmp_path / f"{i}.pt") for i in (4, 6))
    assert_same_tensors(before, after)
    with pytest.raises(AssertionError):
        assert_same_tensors(after, tensors(ckpt / "iter_0000008", tmp_path / "8.pt"))
    # From there on, the curve of a run told to skip steps 5 and 6 (Megatron's
    # iterations_to_skip: their batches consumed, no update, the schedule held).
    skipping = train_here(
        "exp_name=skip", "train_iters=12", "iterations_to_skip=[5,6]", workspace=tmp_path
    )
    curve, reference = losses(run_dir), losses(skipping)
    for s in range(7, 13):
        assert curve[s] == pytest.approx(reference[s], rel=1e-5, abs=1e-5), s


def test_non_finite_gradients_in_a_row_stop_with_exit_1_and_the_last_good_state(
    tmp_path: Path,
) -> None:
    # A finite loss with Inf/NaN gradients at steps 5, 6 and 7: the third in a row stops it.
    run = command("inf", "train_iters=10", "save_interval=4")
    stopped = here(*run, PRIMUS_FAULT_NONFINITE="grad:5,6,7", **env(tmp_path))
    assert stopped.returncode == 1, stopped.stderr[-4000:]
    run_dir = tmp_path / "team/user/inf"
    ckpt = run_dir / "checkpoints"
    assert (
        "steps 5-7 non-finite (grad norm is nan at step 7): 3 in a row, max_skipped_steps is 3; "
        f"the last good state (before step 5) is in {ckpt / 'iter_0000007'}" in stopped.stderr
    )
    assert "loss is" not in stopped.stderr  # the loss stayed finite: the gradient norm caught it
    assert max(losses(run_dir)) == 7 and tracked(run_dir) == 7
    last_good = tensors(ckpt / "iter_0000004", tmp_path / "4.pt")
    assert_same_tensors(last_good, tensors(ckpt / "iter_0000007", tmp_path / "7.pt"))
    resumed = here(*run, **env(tmp_path))  # the same command, the fault gone
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"resumed from {ckpt / 'iter_0000007'} (iteration 7)" in log
    assert sorted(losses(run_dir)) == [*range(2, 8), 9, 10]


# crash-safe checkpoints.


def kill_during_a_save(
    forks: Forks, run: list[str], run_dir: Path, environment: dict[str, str], delay: float
) -> int:
    """Start the run (a process forked by `forks`, Megatron imported); once it logs a step of
    its own (with save_interval 1 the save of that step starts right after), wait `delay`
    seconds and SIGKILL its process alone (kill -9): within 5 s nothing it started is left
    (Megatron's checkpoint worker and the resource tracker, started by multiprocessing's
    spawn, data-loader workers). The step it logged."""
    import os
    import time

    from primus.testing.faults import descendants, steps_logged
    from primus.testing.processes import alive, left_alive

    logged = steps_logged(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    stderr = run_dir.parent / f"{run_dir.name}-stderr-{logged}.txt"  # kept to tell a failure
    pid = forks.start(run, environment, stderr=stderr)
    try:
        while steps_logged(run_dir) <= logged:
            assert alive(pid), (
                f"the run ended before it logged a step:\n{stderr.read_text()[-4000:]}"
            )
            time.sleep(0.002)
        time.sleep(delay)
    finally:
        started = descendants(pid)
        os.kill(pid, signal.SIGKILL)
    assert left_alive([pid, *started], timeout_s=5) == []
    return steps_logged(run_dir)


def latest_complete(ckpt: Path) -> int:
    """The checkpoint a resume must load: the tracker's when it names a complete one (Megatron
    writes it after the save), else the latest complete one (metadata.json is written last)."""
    named = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    complete = [int(p.parent.name[5:]) for p in ckpt.glob("iter_*/metadata.json")]
    return int(named) if named.isdigit() and int(named) in complete else max(complete)


def kill_chain(workspace: Path, name: str, seed: int) -> tuple[list[str], Path, list[int], int]:
    """KILLS / CHAINS runs of one experiment, each killed during a save and each resuming from
    what the previous kill left, then its tracker left empty. Returns the command (whose run
    to the end is the last resume), the run dir, the iteration each resume must start from, and
    how many kills cut a save short."""
    import random

    rng = random.Random(seed)
    run = command(name, f"train_iters={STEPS}", "save_interval=1")
    run_dir, expected, in_save = workspace / "team/user" / name, [], 0
    ckpt = run_dir / "checkpoints"
    with Forks(*MEGATRON) as forks:
        for _ in range(KILLS // CHAINS):
            step = kill_during_a_save(forks, run, run_dir, env(workspace), rng.uniform(0, 0.04))
            expected.append(latest_complete(ckpt))
            in_save += expected[-1] < step  # killed before the save of its step was recorded
    # A kill between Megatron's open(tracker, "w") and its write leaves the tracker empty
    # (Megatron would then exit 0 without training): the same resume must still work.
    (ckpt / "latest_checkpointed_iteration.txt").write_text("")
    expected[-1] = max(int(p.parent.name[5:]) for p in ckpt.glob("iter_*/metadata.json"))
    return run, run_dir, expected, in_save


def test_kills_during_saves_resume_from_the_latest_complete_checkpoint(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """KILLS kill points in all, in CHAINS experiments side by side (each run is mostly one
    process's start-up, on one core; forked from a process that imported Megatron); then each
    experiment's run to the end, in this process (no process is killed there)."""
    import re
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(CHAINS) as pool:
        chains = list(pool.map(kill_chain, [tmp_path] * CHAINS, ["a", "b"], [17, 18]))
    assert sum(in_save for _, _, _, in_save in chains) >= KILLS // 2, chains
    for run, _, _, _ in chains:
        final = here(*run, **env(tmp_path))
        assert final.returncode == 0, final.stderr[-4000:]
    whole = losses(uninterrupted)
    for _, run_dir, expected, _ in chains:
        log = (run_dir / "logs" / "rank-0.log").read_text()
        resumed = re.findall(r"resumed from \S+/iter_\d+ \(iteration (\d+)\)", log)
        assert [int(i) for i in resumed] == expected  # the first run started from scratch
        assert "names 'nothing', not a complete checkpoint" in log
        for metrics in step_metrics(run_dir):  # every step of every run, on the whole curve
            step = metrics["step"]
            assert metrics["loss"] == pytest.approx(whole[step], rel=1e-5, abs=1e-5), step
        assert max(losses(run_dir)) == STEPS


# the data position.


def indexed_dataset(prefix: Path, documents: int = 300) -> Path:
    """A Megatron indexed dataset (.bin/.idx) of random token documents (vocabulary 512)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix.parent.mkdir(parents=True)
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for _ in range(documents):
        doc = rng.integers(0, 511, rng.integers(20, 200))
        builder.add_document(doc, [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def samples(run_dir: Path) -> dict[int, list[str]]:
    """Step -> the hashes of the samples all ranks trained on (megatron.log_samples)."""
    import json

    by_step: dict[int, list[str]] = {}
    for path in run_dir.glob("samples-rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            by_step.setdefault(record["step"], []).extend(record["samples"])
    return {step: sorted(hashes) for step, hashes in sorted(by_step.items())}


def test_a_resume_on_indexed_data_with_another_dp_size_sees_the_same_samples(
    tmp_path: Path,
) -> None:
    # Saved by 2 data-parallel ranks at step 6, resumed by 1: Megatron's position in the data
    # is the global consumed_train_samples, so the resumed run takes up the same global batches.
    prefix = indexed_dataset(tmp_path / "data" / "docs")
    data = [f"data_path=[{prefix}]", "tokenizer_type=NullTokenizer", "split=100,0,0"]
    logged = {"PRIMUS_LOG_SAMPLES": "1", **env(tmp_path)}
    whole = here(*command("data-whole", *data, "train_iters=12"), **logged)
    assert whole.returncode == 0, whole.stderr[-4000:]
    resumed = [*data, "train_iters=12", "save_interval=6"]
    first = primus(*command("data-resumed", *resumed, "exit_interval=6", nproc=2), **logged)
    assert first.returncode == 0, first.stderr[-4000:]
    run_dir = tmp_path / "team/user/data-resumed"
    assert list(samples(run_dir)) == list(range(1, 7))
    second = here(*command("data-resumed", *resumed), **logged)
    assert second.returncode == 0, second.stderr[-4000:]
    expected = samples(tmp_path / "team/user/data-whole")
    assert len(expected) == 12 and all(len(hashes) == 8 for hashes in expected.values())
    assert samples(run_dir) == expected
    rank1 = (run_dir / "samples-rank1.jsonl").read_text()
    assert '"step": 6' in rank1 and '"step": 7' not in rank1  # steps 7-12 on one rank


def test_a_resume_with_a_longer_schedule_is_a_config_error_with_both_fixes(
    tmp_path: Path,
) -> None:
    """Training on with a larger train_iters: Megatron asserted the checkpoint's schedule
    (a traceback, exit 1); now exit 2 naming train_iters, and the hint's fix resumes. A
    resume with another model (num_layers) is exit 2 naming the key, not a shape traceback."""
    run = command("longer", "save_interval=4")
    assert here(*run, "train_iters=4", **env(tmp_path)).returncode == 0
    deeper = here(*run, "train_iters=4", "num_layers=3", **env(tmp_path))  # another model
    assert deeper.returncode == 2 and "Traceback" not in deeper.stderr, deeper.stderr[-3000:]
    assert "error: cli (num_layers=3): the checkpoint " in deeper.stderr
    assert "holds a model with num_layers 2, this run's 3" in deeper.stderr
    longer = here(*run, "train_iters=6", **env(tmp_path))
    assert longer.returncode == 2, longer.stderr[-3000:]
    assert "Traceback" not in longer.stderr
    assert (
        "error: cli (train_iters=6): the checkpoint's learning-rate schedule has total number "
        "of iterations 4, this run's 6" in longer.stderr
    )
    assert "hint: set override_opt_param_scheduler: true" in longer.stderr
    fixed = here(*run, "train_iters=6", "override_opt_param_scheduler=true", **env(tmp_path))
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert [m["step"] for m in step_metrics(tmp_path / "team" / "user" / "longer")] == [2, 3, 4, 6]
