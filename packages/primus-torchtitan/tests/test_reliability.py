"""The reliability promises on TorchTitan (docs/reliability.md), on the tiny CPU recipe:
real training steps in real `primus train` processes, real signals.

Faults that no signal makes come from faulty.py: test-only patches that put NaN in the model's
output or Inf in its gradient at chosen steps, or make the process SIGKILL itself at a chosen
file operation of a checkpoint save. The one-process runs with those patches are forked by a
process that imported them and TorchTitan once (`primus.testing.faults.Forks`).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from primus.core.reliability.preemption import EXIT_PREEMPTED
from primus.testing.checkpoints import dcp_state
from primus.testing.faults import PYTHON, UV, UV_RUN, Forks, Interrupted, interrupt
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import losses, step_metrics, train_run
from primus.testing.torchtitan import write_corpus

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "torchtitan" / "tiny-cpu.yaml"
FAULTY = Path(__file__).with_name("faulty.py")  # imported by the runs, not by this module
# The lr schedule spans 20 steps whatever training.steps is, so a resumed run matches.
SCHEDULE = ("lr_scheduler.total_steps=20", "metrics.log_freq=1")
CHECKPOINTS = ("checkpoint.enable=true", "checkpoint.keep_latest_k=0")
DP2 = ("parallelism.data_parallel_shard_degree=2",)
pytestmark = pytest.mark.slow


def command(name: str, *overrides: str, nproc: int = 1) -> list[str]:
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    return ["train", "pretrain", "--config", str(RECIPE), *launch, *SCHEDULE, f"exp_name={name}",
            *overrides]  # fmt: skip


def site(folder: Path) -> Path:
    """`folder`/site, whose sitecustomize.py imports faulty.py's patches at the start of every
    process that has it on PYTHONPATH."""
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(FAULTY.parent)!r})\nimport faulty  # noqa\n"
    )
    return site


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """The fork server of the one-process runs with faulty.py's patches (`faulty_run`)."""
    with Forks(
        "torchtitan.trainer", env={"PYTHONPATH": str(site(tmp_path_factory.mktemp("f")))}
    ) as server:
        yield server


def faulty_run(
    forks: Forks, workspace: Path, *args: str, **faults: str
) -> subprocess.CompletedProcess[str]:
    """`primus ARGS` of one process with faulty.py's patches and `faults` set, in `workspace`:
    a process forked by `forks`."""
    return forks.run(list(args), {"PRIMUS_WORKSPACE": str(workspace), **faults})


def faulty(workspace: Path, *args: str, **faults: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` (default: `-m primus.cli`) with faulty.py's patches imported at start in
    every process (a sitecustomize.py on PYTHONPATH) and `faults` set, in `workspace`."""
    site_dir = site(workspace)
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
    args = args if args[0] == "-c" else ("-m", "primus.cli", *args)
    return subprocess.run(
        [sys.executable, *args],
        env=env | {"PRIMUS_WORKSPACE": str(workspace), "PYTHONPATH": str(site_dir)} | faults,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_dir(workspace: Path, name: str) -> Path:
    return workspace / "local" / "local" / name


def saved_state(checkpoint: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The model and optimizer tensors of a TorchTitan (DCP) checkpoint folder."""
    state = dcp_state(checkpoint, tmp / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    optimizer = state["optimizer"]
    return tensors | {f"optimizer.{k}": v for k, v in optimizer.items() if torch.is_tensor(v)}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 20
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def assert_losses_match(run: Path, reference: dict[int, float]) -> None:
    """Every step line the run wrote (each attempt's, after each resume) has the reference
    run's loss at that step (CPU fp32: 1e-5)."""
    lines = step_metrics(run)
    assert lines
    for line in lines:
        assert line["loss"] == pytest.approx(reference[line["step"]], rel=1e-5), line["step"]


class Corpus:
    """The local jsonl dataset (`write_corpus`) in `folder`, and the overrides that train on it."""

    def __init__(self, folder: Path) -> None:
        self.texts, overrides = write_corpus(folder)
        self.overrides = tuple(overrides)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer" / "tokenizer.json"))

    def tokens(self, row: int) -> int:
        """The tokens row `row` puts into a rank's buffers: TorchTitan adds BOS and EOS, and
        the inputs are the tokens but the last."""
        return len(self.tokenizer.encode(self.texts[row]).ids) + 1


def reads(run: Path, rank: int) -> list[tuple[int, int]]:
    """(epoch, row id) of each row rank `rank` read (faulty.py's data log), every attempt."""
    path = run / f"reads-rank{rank}.txt"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(int(e), int(i)) for e, i in (line.split() for line in lines if line)]


def batch_hashes(run: Path, rank: int = 0) -> list[tuple[int, str]]:
    """(step, hash of the batch's tokens) of each batch rank `rank` trained on, every attempt."""
    lines = (run / f"batches-rank{rank}.txt").read_text().split("\n")
    return [(int(step), sha) for step, sha in (line.split() for line in lines if line)]


# -- preemption ----------------------------------------------------------------------


LOADERS = ("dataloader.num_workers=2",)  # data-loader worker processes, as real jobs have
# (signal, to whom, how primus starts, the step after which it is sent, the marker's name)
STOPS = [
    (signal.SIGTERM, 1, PYTHON, 4, "SIGTERM"),  # rank 0 did not get it: it names rank 1's
    (signal.SIGTERM, "everyone", UV_RUN, 9, "SIGTERM"),  # as Slurm and systemd do
    (signal.SIGINT, None, UV_RUN, 14, "SIGINT"),  # Ctrl-C
]


@pytest.fixture(scope="module")
def whole_dp2(tmp_path_factory: pytest.TempPathFactory, data: Corpus) -> dict[int, float]:
    """The uninterrupted run: 2 processes, FSDP over both, 20 steps on the jsonl data."""
    workspace = tmp_path_factory.mktemp("whole")
    run = train_run(RECIPE, workspace, *SCHEDULE, *DP2, *data.overrides, *LOADERS,
                    "exp_name=whole", "training.steps=20", nproc=2)  # fmt: skip
    return losses(run)


@pytest.fixture(scope="module")
def preempted(
    tmp_path_factory: pytest.TempPathFactory, data: Corpus
) -> tuple[Path, list[Interrupted]]:
    """The same run (its data loaders in worker processes) preempted three times (STOPS) and
    resumed each time by the same command; then the run to its end."""
    if UV is None:
        pytest.skip("needs uv")
    workspace = tmp_path_factory.mktemp("preempt")
    overrides = (*DP2, *data.overrides, *LOADERS, *CHECKPOINTS, "checkpoint.interval=5",
                 "training.steps=20")  # fmt: skip
    cmd = command("preempt", *overrides, nproc=2)
    run = run_dir(workspace, "preempt")
    env = {"PRIMUS_WORKSPACE": str(workspace)}
    stops = [
        interrupt(cmd, run, sig, at_step=at, to_rank=to, prefix=prefix, env=env)
        for sig, to, prefix, at, _ in STOPS
    ]
    train_run(RECIPE, workspace, *SCHEDULE, "exp_name=preempt", *overrides, nproc=2)
    return run, stops


def test_a_signal_stops_every_rank_with_a_checkpoint_and_exit_75(
    preempted: tuple[Path, list[Interrupted]],
) -> None:
    run, stops = preempted
    for stop, (_, _, _, at, signal_name) in zip(stops, STOPS, strict=True):
        assert stop.returncode == EXIT_PREEMPTED and stop.preempted, stop.stderr[-3000:]
        step = stop.marker["step"]
        # rank 0 logs step `at` before the ranks agree at its end: a signal to rank 1 right
        # after the log may still stop the run at `at`
        assert at <= step < at + 4
        checkpoint = run / "checkpoint" / f"step-{step}"
        assert stop.marker["checkpoint"] == str(checkpoint)
        assert (checkpoint / ".metadata").is_file()
        assert stop.marker["signal"] == signal_name  # rank 0 writes it
        assert f"at step {step}: checkpoint {checkpoint} written" in stop.stderr
        assert f"run the same command again to resume from step {step}" in stop.stderr
        assert "Traceback" not in stop.stderr and "Unable to shutdown" not in stop.stderr
        assert stop.ended_at - stop.signalled_at < 60  # no worker waited for torchrun's kill
        assert stop.left == []  # workers, loader workers, reapers: all ended with the run
    # only rank 1 got the first SIGTERM; rank 0 stopped at the same step (the ranks agree)
    first = stops[0].marker["step"]
    assert stops[0].stderr.count("SIGTERM received") == 1
    assert f"preempted: SIGTERM at step {first}" in stops[0].stderr  # rank 1's line
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"preempted by SIGTERM at step {first}; checkpoint" in log


def test_the_same_command_resumes_and_matches_the_uninterrupted_run(
    preempted: tuple[Path, list[Interrupted]], whole_dp2: dict[int, float]
) -> None:
    run, stops = preempted
    steps = [m["step"] for m in step_metrics(run)]
    assert steps == list(range(1, 21))  # each resume goes on at the next step, none repeated
    log = (run / "logs" / "rank-0.log").read_text()
    for stop in stops:
        assert f"Loading the checkpoint from {run}/checkpoint/step-{stop.marker['step']}." in log
    assert_losses_match(run, whole_dp2)


def test_without_checkpoints_a_signal_stops_the_run_saying_it_cannot_resume(
    tmp_path: Path,
) -> None:
    run = run_dir(tmp_path, "unsaved")
    env = {"PRIMUS_WORKSPACE": str(tmp_path)}
    stop = interrupt(command("unsaved", "training.steps=20"), run, signal.SIGTERM, at_step=3,
                     env=env)  # fmt: skip
    assert stop.returncode == 1 and stop.marker is None, stop.stderr[-3000:]
    assert "SIGTERM at step" in stop.stderr
    said = "SIGTERM received: stopping after this step, without a checkpoint (checkpoint.enable is"
    assert said in stop.stderr and "stopped without a checkpoint (checkpoint." in stop.stderr
    assert "hint: set checkpoint.enable: true so that a preempted run can resume" in stop.stderr
    assert max(losses(run)) < 20


# -- non-finite numbers (the runs from here on train on a local jsonl dataset) -------


@dataclass
class Whole:
    """The uninterrupted run on the jsonl data: its run dir, losses, the number of file
    operations of one of its saves, and the hash of each step's batch."""

    run: Path
    losses: dict[int, float]
    save_ops: int
    batches: dict[int, str]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, data: Corpus, forks: Forks) -> Whole:
    """One process, 20 steps, a checkpoint every 5 steps."""
    workspace = tmp_path_factory.mktemp("whole1")
    ops = workspace / "ops.txt"
    cmd = command("whole", *data.overrides, *CHECKPOINTS, "checkpoint.interval=5",
                  "training.steps=20")  # fmt: skip
    result = faulty_run(forks, workspace, *cmd, PRIMUS_TEST_SAVE_OPS=str(ops),
                        PRIMUS_TEST_DATA_LOG="1")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {int(n) for n in ops.read_text().split()}
    assert len(counts) == 1, counts  # every save has the same file operations
    run = run_dir(workspace, "whole")
    batches = dict(batch_hashes(run))
    assert sorted(batches) == list(range(1, 21)) and len(set(batches.values())) == 20
    return Whole(run, losses(run), counts.pop(), batches)


# How the patch decides: fused Adam skips on the device (its found_inf), foreach on the host.
DECIDED = {"fused": "decided on the device", "foreach": "decided on the host"}


@pytest.fixture(scope="module", params=sorted(DECIDED))
def transient(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data: Corpus,
    forks: Forks,
) -> tuple[Path, str]:  # fmt: skip
    """NaN loss at step 4, Inf gradient at step 7; a checkpoint at every step; the optimizer's
    implementation `request.param` (TorchTitan's default "fused" runs fused on CPU too)."""
    workspace = tmp_path_factory.mktemp("transient")
    cmd = command("transient", *data.overrides, *CHECKPOINTS, "checkpoint.interval=1",
                  "training.steps=10", f"optimizer.implementation={request.param}")  # fmt: skip
    result = faulty_run(forks, workspace, *cmd, PRIMUS_TEST_NAN_LOSS="4", PRIMUS_TEST_INF_GRAD="7")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert f"non-finite steps: {DECIDED[request.param]}" in output
    return run_dir(workspace, "transient"), output


def test_a_nonfinite_step_is_skipped_and_logged_and_the_run_goes_on(
    transient: tuple[Path, str], whole: Whole
) -> None:
    run, output = transient
    assert (
        "step 4 skipped: loss is nan, grad norm is nan; 1 in a row (max_skipped_steps 3)" in output
    )
    assert "step 7 skipped: grad norm is nan; 1 in a row (max_skipped_steps 3)" in output
    curve = losses(run)
    assert sorted(curve) == [1, 2, 3, 5, 6, 8, 9, 10]  # no step line for a skipped step
    for step in (1, 2, 3):
        assert curve[step] == pytest.approx(whole.losses[step], rel=1e-5)
    assert curve[10] < curve[1] - 0.5  # training went on


def test_a_skipped_step_leaves_the_weights_and_optimizer_as_they_were(
    transient: tuple[Path, str], tmp_path: Path
) -> None:
    checkpoint = transient[0] / "checkpoint"
    state = {n: saved_state(checkpoint / f"step-{n}", tmp_path) for n in (3, 4, 5, 6, 7)}
    assert_same_state(state[3], state[4])
    assert_same_state(state[6], state[7])
    moved = [k for k in state[4] if not torch.equal(state[4][k], state[5][k])]
    assert len(moved) == len(state[4])  # the good step after the skip updated every tensor


@pytest.fixture(scope="module")
def persistent(
    tmp_path_factory: pytest.TempPathFactory, data: Corpus, forks: Forks
) -> tuple[Path, list[str], subprocess.CompletedProcess[str]]:
    """NaN loss from step 5 on, max_skipped_steps 2, a checkpoint every 4 steps."""
    workspace = tmp_path_factory.mktemp("persistent")
    cmd = command("persistent", *data.overrides, *CHECKPOINTS, "checkpoint.interval=4",
                  "training.steps=10")  # fmt: skip
    stop = [*cmd, "max_skipped_steps=2"]
    result = faulty_run(forks, workspace, *stop,
                        PRIMUS_TEST_NAN_LOSS=",".join(map(str, range(5, 11))))  # fmt: skip
    return workspace, cmd, result


def test_nonfinite_steps_in_a_row_stop_the_run_with_the_last_good_state(
    persistent: tuple[Path, list[str], subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    workspace, _, result = persistent
    run = run_dir(workspace, "persistent")
    assert result.returncode == 1, result.stderr[-3000:]
    checkpoint = run / "checkpoint" / "step-6"
    assert (
        "error: steps 5-6 non-finite (loss is nan, grad norm is nan at step 6): 2 in a row, "
        f"max_skipped_steps is 2; the last good state (before step 5) is in {checkpoint}"
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step-4", "step-6"]
    assert_same_state(saved_state(checkpoint.parent / "step-4", tmp_path),
                      saved_state(checkpoint, tmp_path))  # fmt: skip


def test_the_last_good_state_is_what_the_next_run_resumes_from(
    persistent: tuple[Path, list[str], subprocess.CompletedProcess[str]], forks: Forks
) -> None:
    workspace, cmd, _ = persistent
    run = run_dir(workspace, "persistent")
    result = faulty_run(forks, workspace, *cmd)  # the fault gone
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"Loading the checkpoint from {run}/checkpoint/step-6." in log
    assert [m["step"] for m in step_metrics(run)] == [1, 2, 3, 4, 7, 8, 9, 10]


# -- crash-safe checkpoints ----------------------------------------------------------


def kill_points(ops: int, randoms: int = 20, seed: int = 17) -> list[tuple[int, int]]:
    """(save, file operation) pairs: the first operation, the .metadata.tmp file, its rename
    and right after the save, then random ones. `ops` operations per save; `ops + 1` is right
    after it."""
    rng = random.Random(seed)
    fixed = [(1, 1), (1, 2), (1, ops - 1), (1, ops), (1, ops + 1), (2, ops - 1)]
    return fixed + [(rng.choice((1, 2)), rng.randint(1, ops + 1)) for _ in range(randoms)]


@pytest.fixture(scope="module")
def killed(
    tmp_path_factory: pytest.TempPathFactory, data: Corpus, whole: Whole
) -> tuple[Path, Path, list[tuple[int, int]]]:
    """One run (a checkpoint every step) SIGKILLed inside a save, resumed, SIGKILLed again...
    once per kill point, then resumed to its end."""
    workspace = tmp_path_factory.mktemp("killed")
    logs = workspace / "attempts"
    logs.mkdir()
    points = kill_points(whole.save_ops)
    kills = [f"{s}:{e}" for s, e in points]
    cmd = command("killed", *data.overrides, *CHECKPOINTS, "checkpoint.interval=1",
                  "training.steps=20")  # fmt: skip
    driver = f"import faulty; faulty.run_each({kills!r}, {str(logs)!r}, {cmd!r})"
    result = faulty(workspace, "-c", driver, PRIMUS_TEST_DATA_LOG="1")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir(workspace, "killed"), logs, points


def test_a_sigkill_during_a_save_never_leaves_the_resume_on_a_partial_checkpoint(
    killed: tuple[Path, Path, list[tuple[int, int]]], whole: Whole
) -> None:
    run, logs, points = killed
    ops = whole.save_ops
    runs = json.loads((logs / "runs.json").read_text())
    assert len(points) >= 26  # 6 chosen, 20 random
    assert [r["ended"] for r in runs] == ["signal 9"] * len(points) + ["exit 0"]
    latest = 0  # the latest complete checkpoint: the step each attempt must resume from
    for i, (save, op) in enumerate(points):
        log = (logs / f"run-{i + 1}.log").read_text()
        killed_step = latest + save  # a checkpoint every step: save s is of step latest + s
        latest += save if op > ops else save - 1
        assert killed_step < 20, "the plan must kill before the last step"
        expected = f"checkpoint/step-{latest}." if latest else "fresh start"
        assert expected in log, (i, save, op)
        if op <= ops:
            assert re.search(rf"step-{killed_step}\b[^\n]* incomplete", log), (i, save, op)
    assert [m["step"] for m in step_metrics(run)][-1] == 20
    assert_losses_match(run, whole.losses)


def test_each_resume_trains_on_the_batches_of_the_uninterrupted_run(
    killed: tuple[Path, Path, list[tuple[int, int]]], whole: Whole
) -> None:
    """The data position on one rank: every batch of every attempt (the steps an attempt redid after
    its resume too) is the uninterrupted run's batch of that step, row for row."""
    trained = batch_hashes(killed[0])
    assert {step for step, _ in trained} == set(range(1, 21))
    assert len(trained) > 30  # the attempts redid steps
    assert [(step, sha) for step, sha in trained if sha != whole.batches[step]] == []


def test_a_save_over_a_complete_checkpoint_is_incomplete_until_it_is_done(
    tmp_path: Path, data: Corpus, whole: Whole, forks: Forks
) -> None:
    """A run resumed from an earlier step (checkpoint.load_step 15, another lr) saves step-20
    again over the uninterrupted run's complete one, and is SIGKILLed inside that save: the
    old .metadata must not be left over the partly new files."""
    checkpoints = run_dir(tmp_path, "again") / "checkpoint"
    for step in (15, 20):
        shutil.copytree(whole.run / "checkpoint" / f"step-{step}", checkpoints / f"step-{step}")
    cmd = command("again", *data.overrides, *CHECKPOINTS, "training.steps=20", "optimizer.lr=1e-3")
    killed = faulty_run(forks, tmp_path, *cmd, "checkpoint.load_step=15",
                        PRIMUS_TEST_KILL_AT="1:100")  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (checkpoints / "step-20" / ".metadata").exists()
    assert "step-20 is written again; its .metadata removed" in killed.stdout + killed.stderr
    resumed = faulty_run(forks, tmp_path, *cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert f"Loading the checkpoint from {checkpoints}/step-15." in output
    assert "step-20 incomplete" in output


# -- data position when the data-parallel size changes -------------------------------

BATCH_TOKENS = 4 * 128  # the recipe's training.local_batch_size x training.seq_len


@pytest.fixture(scope="module")
def resharded(tmp_path_factory: pytest.TempPathFactory, data: Corpus, forks: Forks) -> Path:
    """One run on the jsonl data (400 rows): 2 data-parallel ranks to step 3, resumed on 1 to
    step 6, then on 2 again to step 12, past the end of the first epoch."""
    workspace = tmp_path_factory.mktemp("reshard")
    for steps, nproc in ((3, 2), (6, 1), (12, 2)):
        dp = DP2 if nproc == 2 else ()
        cmd = command("reshard", *data.overrides, *dp, *CHECKPOINTS, f"training.steps={steps}",
                      nproc=nproc)  # fmt: skip
        if nproc == 1:
            result = faulty_run(forks, workspace, *cmd, PRIMUS_TEST_DATA_LOG="1")
        else:
            result = faulty(workspace, *cmd, PRIMUS_TEST_DATA_LOG="1")
        assert result.returncode == 0, result.stderr[-3000:]
    return run_dir(workspace, "reshard")


def test_a_resume_on_another_data_parallel_size_reads_each_remaining_row_once(
    resharded: Path, data: Corpus
) -> None:
    log = (resharded / "logs" / "rank-0.log").read_text()
    assert "data position: saved by 2 data-parallel ranks, resumed on 1" in log
    assert "data position: saved by 1 data-parallel ranks, resumed on 2" in log
    read = [row for rank in (0, 1) for row in reads(resharded, rank)]
    first_epoch = sorted(row for epoch, row in read if epoch == 0)
    assert first_epoch == list(range(len(data.texts)))  # each row once: none twice, none left
    assert any(epoch == 1 for epoch, _ in read)  # the first epoch was read to its end


def test_the_buffered_tokens_move_with_the_position(
    resharded: Path, data: Corpus, tmp_path: Path
) -> None:
    """Every token read is trained on or still buffered at the end, once: the tokens a rank
    had read but not trained on when it saved went to a rank of the resumed run."""
    read = sum(data.tokens(row) for rank in (0, 1) for _, row in reads(resharded, rank))
    trained = sum(len(batch_hashes(resharded, rank)) for rank in (0, 1)) * BATCH_TOKENS
    positions = dcp_state(resharded / "checkpoint" / "step-12", tmp_path / "last.pt")["dataloader"]
    buffered = sum(
        len(pickle.loads(positions[f"dp_rank_{rank}"])["dataset_state"]["inputs_buffer"])
        for rank in (0, 1)
    )
    assert read == trained + buffered


def test_another_data_parallel_size_on_other_data_is_a_config_error(
    preempted: tuple[Path, list[Interrupted]], tmp_path: Path
) -> None:
    """The mock data (2 ranks in the preempted run) has no re-shard: an error that says so,
    not TorchTitan's assertion."""
    moved = run_dir(tmp_path, "moved") / "checkpoint" / "step-20"
    shutil.copytree(preempted[0] / "checkpoint" / "step-20", moved)
    with in_process():  # refused before training: the message is under test
        result = primus_here(*command("moved", *CHECKPOINTS, "training.steps=20"),
                             PRIMUS_WORKSPACE=str(tmp_path))  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        "the checkpoint's data position was saved by 2 data-parallel ranks, this run has 1: "
        "re-sharding it is supported for TorchTitan's text datasets" in result.stderr
    )


# out of memory.


def test_a_model_too_large_for_memory_ends_the_run_with_one_message(tmp_path: Path) -> None:
    """A model no host can hold (13 trillion parameters): the allocator's refusal is one
    message with the size, the memory projection of the layout and what would make it fit,
    exit 1 (in this process: the message, not the process boundary, is under test)."""
    from primus.testing.fuzz_runs import run_in_process

    huge = ("model.dim=1048576", "model.ffn_hidden_dim=1048576")
    with in_process():  # a training process's own set-up (a reaper, shielded helpers) left out
        outcome = run_in_process(command("huge", *huge), tmp_path, {})
    assert outcome.code == 1, outcome.stderr[-3000:]
    message = outcome.stderr[outcome.stderr.index("error: ") :]
    said = re.match(
        r"error: out of memory on rank 0: .*can't allocate memory.* GiB\); the projection of "
        r"this layout: ([\d,.]+) GiB on its most loaded GPU\n",
        message,
    )
    assert said, message
    assert float(said.group(1).replace(",", "")) > 8192  # more than the allocation that failed
    assert "hint: a smaller micro batch or sequence length" in message
    assert "Traceback" not in outcome.stderr
