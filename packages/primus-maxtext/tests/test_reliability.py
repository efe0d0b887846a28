"""The reliability promises on MaxText (CPU): real `primus train` subprocesses, real
signals, real non-finite numbers.

The uninterrupted run these runs are compared with is the golden curve of the tiny recipe
(`golden/tiny-cpu.json`, 20 steps), which test_training's uninterrupted run must match within
1e-5 (CPU_FP32): the same recipe, seed and schedule, without a run of its own here. Faults are
made by the test-only patch in `faults/sitecustomize.py` (put on PYTHONPATH by the test). The
one-process runs that no stop signal reaches (the run SIGKILLed during a save among them) are
forked by a process that imported MaxText once (conftest's `forks`; sitecustomize imported again
in each, with the run's faults).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from primus.core.reliability.preemption import EXIT_PREEMPTED
from primus.testing.faults import (
    PYTHON,
    UV,
    UV_RUN,
    Forks,
    Interrupted,
    descendants,
    interrupt,
    steps_logged,
)
from primus.testing.golden import CPU_FP32
from primus.testing.processes import alive, left_alive
from primus.testing.runs import losses, patch_status, step_metrics

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parents[2] / "configs" / "maxtext" / "tiny-cpu.yaml"
FAULTS = str(HERE / "faults")
GOLDEN = {
    int(k): v
    for k, v in json.loads((HERE / "golden" / "tiny-cpu.json").read_text())["losses"].items()
}
# the golden recipe, with orbax checkpoints every 5 steps
KEYS = ("learning_rate_schedule_steps=20", "enable_checkpointing=true", "checkpoint_period=5")
pytestmark = pytest.mark.slow
Done = subprocess.CompletedProcess[str]
FAULT = ("3=nan", *(f"{step}=inf" for step in range(7, 13)))  # faults/sitecustomize.py


def command(exp: str, *overrides: str, nproc: int = 1) -> list[str]:
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    return ["train", "pretrain", "--config", str(RECIPE), *launch, *KEYS, f"exp_name={exp}",
            *overrides]  # fmt: skip


def forked(forks: Forks, workspace: Path, *args: str, **env: str) -> Done:
    """`primus ARGS` of one process in `workspace`, with the faults `env` sets: a process forked
    by `forks` (faults/sitecustomize.py imported again in it, with `env`)."""
    return forks.run(list(args), {"PRIMUS_WORKSPACE": str(workspace), **env}, ("sitecustomize",))


def killed(
    forks: Forks, workspace: Path, args: list[str], ready: Callable[[], bool], **env: str
) -> tuple[int, list[int]]:
    """`primus ARGS` of one process in `workspace` with the faults `env` sets (as `forked`),
    SIGKILLed alone once `ready()`: its exit code, and the processes it had started that are
    alive 5 s on."""
    environment = {"PRIMUS_WORKSPACE": str(workspace), **env}
    pid = forks.start(args, environment, reload=("sitecustomize",))
    try:
        deadline = time.monotonic() + 600
        while not ready():
            assert alive(pid) and time.monotonic() < deadline, "the run ended before it was ready"
            time.sleep(0.01)
    finally:
        started = descendants(pid)
        os.kill(pid, signal.SIGKILL)
    return forks.wait(pid), left_alive(started, timeout_s=5)


def run_dir_of(workspace: Path, exp: str) -> Path:
    team, user = os.environ.get("PRIMUS_TEAM", "local"), os.environ.get("PRIMUS_USER", "local")
    return workspace / team / user / exp


def log(run_dir: Path, rank: int = 0) -> str:
    return (run_dir / "logs" / f"rank-{rank}.log").read_text()


def saved_steps(run_dir: Path) -> list[int]:
    """The orbax steps of the run (MaxText's step numbers, from 0), complete ones only."""
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if (p / "_CHECKPOINT_METADATA").is_file())


def assert_matches(curve: dict[int, float], expected: dict[int, float]) -> None:
    for step, loss in expected.items():
        assert curve[step] == pytest.approx(loss, rel=CPU_FP32.rtol), (step, curve[step], loss)


# ---- preemption -----------------------------------------------------------------


# the signal, the step it waits for, to whom (the launcher, a rank, everyone), how primus starts
Hit = tuple[signal.Signals, int, int | str | None, list[str]]


def preempt(
    workspace: Path, exp: str, hits: list[Hit], *keys: str, nproc: int = 1,
    forks: Forks | None = None, **faults: str,
) -> tuple[Path, list[Interrupted], Done | None]:  # fmt: skip
    """Run the same command once per hit (with the faults `faults` sets besides slower steps),
    each time signalled once it has logged the hit's step (the launcher, or the worker of the
    hit's rank), then once more to the end (one process only, forked by `forks`: two take
    long)."""
    run_dir = run_dir_of(workspace, exp)
    env = {"PRIMUS_WORKSPACE": str(workspace), "PYTHONPATH": FAULTS,
           "PRIMUS_TEST_STEP_SECONDS": "0.3", **faults}  # fmt: skip
    cmd = command(exp, *keys, nproc=nproc)
    stops = [
        interrupt(cmd, run_dir, sig, at_step=step, to_rank=to, prefix=prefix, env=env)
        for sig, step, to, prefix in hits
    ]
    if nproc > 1:
        return run_dir, stops, None
    assert forks is not None, "a one-process run is run again to its end, forked by forks"
    again = forked(forks, workspace, *cmd)
    assert again.returncode == 0, again.stderr[-3000:]
    return run_dir, stops, again


@pytest.fixture(scope="module")
def one_process(
    tmp_path_factory: pytest.TempPathFactory, forks: Forks
) -> tuple[Path, list[Interrupted], Done | None]:
    """Ctrl-C (SIGINT to `uv run`) in a one-process run at step 5, then resumed to step 20."""
    if UV is None:
        pytest.skip("needs uv")
    hits: list[Hit] = [(signal.SIGINT, 5, None, UV_RUN)]
    return preempt(tmp_path_factory.mktemp("ws"), "one", hits, "steps=20", forks=forks)


# what `resized` gives: the resized run's dir, its two stops, the samples of the uninterrupted
# run and of the resized one (folders of faults/sitecustomize.py's PRIMUS_TEST_SAMPLES)
Resized = tuple[Path, list[Interrupted], Path, Path]


@pytest.fixture(scope="module")
def resized(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> Resized:
    """Grain on real data (a worker process per process). Uninterrupted: 20 steps in one
    process. Resized: 4 steps in one process, then the same experiment in two (Primus's
    spawner; the global batch doubles: 4 -> 8 samples): SIGUSR1 to the worker of rank 1 only
    once step 5 is logged; the rerun resumes and gets SIGTERM at step 8 in every process under
    `uv run` (uv, the spawner, the workers, grain's workers, the reapers). The two-process runs
    serve both the preemption test and the data position's."""
    if UV is None:
        pytest.skip("needs uv")
    workspace = tmp_path_factory.mktemp("ws")
    data = write_corpus(workspace / "data")
    whole, resumed = workspace / "whole-samples", workspace / "resumed-samples"
    for name, folder, steps in (("whole", whole, 20), ("resized", resumed, 4)):
        folder.mkdir()
        cmd = command(name, *data, f"steps={steps}")
        done = forked(forks, workspace, *cmd, PRIMUS_TEST_SAMPLES=str(folder))
        assert done.returncode == 0, done.stderr[-3000:]
    hits: list[Hit] = [(signal.SIGUSR1, 5, 1, PYTHON), (signal.SIGTERM, 8, "everyone", UV_RUN)]
    run_dir, stops, _ = preempt(workspace, "resized", hits, "steps=12", *data, nproc=2,
                                PRIMUS_TEST_SAMPLES=str(resumed))  # fmt: skip
    return run_dir, stops, whole, resumed


def assert_preempted(run_dir: Path, hit: Interrupted, signal_name: str) -> int:
    """The run stopped with exit 75 at a step boundary with a complete checkpoint of that
    step, and said so: the step."""
    assert hit.returncode == EXIT_PREEMPTED, hit.stderr[-3000:]
    assert hit.marker is not None
    step = hit.marker["step"]
    assert hit.marker["checkpoint"] == str(run_dir / "checkpoints" / str(step - 1))
    assert step - 1 in saved_steps(run_dir)  # orbax counts from 0
    assert (
        f"{signal_name} at step {step}: checkpoint {hit.marker['checkpoint']} written" in hit.stderr
    )
    assert "run the same command again to resume" in hit.stderr
    assert hit.left == []  # the spawner, workers, grain's workers and reapers all ended
    return step


def test_ctrl_c_stops_after_the_step_with_a_checkpoint_and_the_rerun_matches(
    one_process: tuple[Path, list[Interrupted], Done | None],
) -> None:
    run_dir, [hit], _ = one_process
    step = assert_preempted(run_dir, hit, "SIGINT")
    assert 5 <= step < 20
    assert "[primus] SIGINT received: stopping after this step with a checkpoint" in hit.stderr
    assert patch_status(run_dir)["maxtext.preemption"][0] == "applied"
    assert f"restoring from this run's directory step {step - 1}" in log(run_dir)
    # every step once: the preempted run's 1..step, then the rerun's step+1..20
    assert [m["step"] for m in step_metrics(run_dir)] == list(range(1, 21))
    assert_matches(losses(run_dir), GOLDEN)  # after the resume too: 1e-5


def test_two_workers_stop_at_the_same_step_on_a_signal_to_one_or_to_the_launcher(
    resized: Resized,
) -> None:
    run_dir, [to_rank_1, to_launcher], _, _ = resized
    # rank 0 agreed to stop on rank 1's signal and wrote the marker
    first = assert_preempted(run_dir, to_rank_1, "SIGUSR1")  # rank 0 names rank 1's signal
    assert to_rank_1.stderr.count("[primus] SIGUSR1 received") == 1  # rank 1 only
    assert f"[primus] preempted by SIGUSR1 at step {first}" in to_rank_1.stderr
    second = assert_preempted(run_dir, to_launcher, "SIGTERM")
    assert to_launcher.stderr.count("[primus] SIGTERM received") == 2  # passed on to both
    # torch, hidden from MaxText's processes (its adapter's unused_modules): transformers'
    # notice that it was not found is dropped
    assert "PyTorch was not found" not in to_launcher.stderr
    assert 5 <= first < 8 <= second < 12
    for rank in (0, 1):
        text = log(run_dir, rank)
        assert f"step {first}/12 | loss" in text and f"step {second}/12 | loss" in text
        assert f"restoring from this run's directory step {first - 1}" in text
    assert [m["step"] for m in step_metrics(run_dir)] == list(range(1, second + 1))


# ---- non-finite numbers ---------------------------------------------------------


@pytest.fixture(scope="module")
def nonfinite(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> tuple[Path, Done, Done]:
    """NaN at step 3 (transient), Inf from step 7 on (persistent), max_skipped_steps=2:
    the run skips 3, skips 7 and stops at 8; the same command without the fault resumes."""
    workspace = tmp_path_factory.mktemp("ws")
    cmd = command("nonfinite", "steps=12", "max_skipped_steps=2")
    faulty = forked(forks, workspace, *cmd, PRIMUS_TEST_NONFINITE=",".join(FAULT))
    fixed = forked(forks, workspace, *cmd)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    return run_dir_of(workspace, "nonfinite"), faulty, fixed


def test_a_transient_nonfinite_step_is_skipped_and_the_run_goes_on(
    nonfinite: tuple[Path, Done, Done],
) -> None:
    run_dir, faulty, _ = nonfinite
    assert "step 3 skipped: loss is nan, grad norm is nan; 1 in a row (max_skipped_steps 2)" in (
        faulty.stderr
    )
    assert "step 4 skipped" not in faulty.stderr
    curve = losses(run_dir)
    # the weights after step 2 are kept: step 4 computes the loss that step 3 would have
    assert_matches(curve, {1: GOLDEN[1], 2: GOLDEN[2], 4: GOLDEN[3], 5: GOLDEN[4], 6: GOLDEN[5]})


def test_persistent_nonfinite_steps_stop_the_run_with_the_last_good_state(
    nonfinite: tuple[Path, Done, Done],
) -> None:
    run_dir, faulty, _ = nonfinite
    assert faulty.returncode == 1, faulty.stderr[-3000:]
    # Inf x the gradients: inf, and NaN where a gradient is 0, so the norm is NaN
    assert "step 7 skipped: loss is inf, grad norm is nan; 1 in a row" in faulty.stderr
    assert "step 8 skipped: loss is inf, grad norm is nan; 2 in a row" in faulty.stderr
    assert "step 9/12" not in faulty.stderr  # stopped at step 8
    checkpoint = run_dir / "checkpoints" / "7"
    assert (
        "error: steps 7-8 non-finite (loss is inf, grad norm is nan at step 8): 2 in a row, "
        f"max_skipped_steps is 2; the last good state (before step 7) is in {checkpoint}"
    ) in faulty.stderr
    assert "Traceback" not in faulty.stderr
    assert 7 in saved_steps(run_dir)
    assert "restoring from this run's directory step 7" in log(run_dir)
    curve = losses(run_dir)
    assert sorted(curve) == list(range(1, 13))
    # 5 good updates before the stop (steps 1, 2, 4, 5, 6): step 9 computes golden step 6
    assert_matches(curve, {9: GOLDEN[6], 10: GOLDEN[7], 11: GOLDEN[8], 12: GOLDEN[9]})


# ---- crash-safe checkpoints -----------------------------------------------------

KILLS = 20
TMP = ".orbax-checkpoint-tmp"  # orbax writes a step there, then renames it to the step number


def complete_steps(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def unfinished(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TMP in p.name)


def said(saver: int, out: Path) -> list[str]:
    """The lines saver `saver` has written to `out` once it wrote one (asserted alive before)."""
    deadline = time.monotonic() + 60
    while not (text := out.read_text() if out.is_file() else "").endswith("\n"):
        assert alive(saver) and time.monotonic() < deadline, text
        time.sleep(0.001)
    return text.splitlines()


@pytest.fixture(scope="module")
def killed_saves(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """SIGKILL to faults/saver.py (MaxText's orbax Checkpointer saving step after step; each a
    process forked by one that imported it once) at KILLS random moments of a save (0-30 ms
    after its folder appeared, 0-0.3 s after the first save was complete); then
    faults/checker.py opens each folder as MaxText's resume does. One dict per kill: what was
    on disk, what was picked."""
    root, rng, kills = tmp_path_factory.mktemp("saves"), random.Random(17), []
    savers = subprocess.Popen([sys.executable, f"{FAULTS}/saver.py"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert savers.stdin is not None and savers.stdout is not None
    for i in range(KILLS):
        folder, out = root / f"kill-{i}", root / f"kill-{i}.out"
        savers.stdin.write(f"{folder}\n")
        savers.stdin.flush()
        saver = int(savers.stdout.readline())
        assert said(saver, out)[0] == "committed 0"
        time.sleep(rng.uniform(0, 0.3))
        deadline = time.monotonic() + 10
        while not unfinished(folder) and time.monotonic() < deadline:  # a save has begun
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.03))  # a save takes about 25 ms here
        os.kill(saver, signal.SIGKILL)
        while alive(saver):
            time.sleep(0.001)
        last = out.read_text().split()
        kills.append({"folder": str(folder), "said": int(last[-1]),
                      "complete": complete_steps(folder), "unfinished": unfinished(folder)})  # fmt: skip
    savers.stdin.close()
    assert savers.wait(timeout=60) == 0
    checker = subprocess.run([sys.executable, f"{FAULTS}/checker.py", *(k["folder"] for k in kills)],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert checker.returncode == 0, checker.stderr[-3000:]
    picked = [json.loads(line) for line in checker.stdout.splitlines() if line.startswith("{")]
    return [
        kill | {"picked": p["step"], "whole": p["whole"]}
        for kill, p in zip(kills, picked, strict=True)
    ]


def test_a_kill_during_a_save_leaves_the_last_complete_checkpoint_to_resume_from(
    killed_saves: list[dict],
) -> None:
    for kill in killed_saves:
        # the last step the saver saw complete, or the one it completed as it was killed
        assert kill["picked"] == kill["complete"][-1], kill
        assert kill["picked"] - kill["said"] in (0, 1), kill
        assert kill["whole"], kill  # loaded, every value that step's
    mid_save = [k for k in killed_saves if k["unfinished"]]
    assert len(mid_save) >= KILLS // 2, killed_saves  # most kills cut a save short


@pytest.fixture(scope="module")
def killed_run(
    tmp_path_factory: pytest.TempPathFactory, forks: Forks
) -> tuple[Path, list[int], list[str], Done]:
    """A run saving every step, SIGKILLed while a save is unfinished, then the same command
    again to step 20: (run dir, complete steps and unfinished saves at the kill, the rerun)."""
    workspace = tmp_path_factory.mktemp("ws")
    run_dir = run_dir_of(workspace, "killed")
    folder = run_dir / "checkpoints"

    def saving() -> bool:  # a save unfinished after step 2
        return steps_logged(run_dir) >= 2 and folder.is_dir() and bool(unfinished(folder))

    cmd = command("killed", "steps=20", "checkpoint_period=1")
    code, left = killed(forks, workspace, cmd, saving, PRIMUS_TEST_STEP_SECONDS="0.1")
    assert code == -signal.SIGKILL
    assert left == []  # kill -9: nothing the run started outlives it by 5 s
    complete, cut = complete_steps(folder), unfinished(folder)
    again = forked(forks, workspace, *cmd)
    assert again.returncode == 0, again.stderr[-3000:]
    return run_dir, complete, cut, again


def test_a_run_killed_during_a_save_resumes_from_the_last_complete_one(
    killed_run: tuple[Path, list[int], list[str], Done],
) -> None:
    run_dir, complete, cut, _ = killed_run
    assert cut, "the kill did not land during a save"
    assert f"restoring from this run's directory step {complete[-1]}" in log(run_dir)
    assert_matches(losses(run_dir), GOLDEN)


# ---- data position --------------------------------------------------------------


def write_corpus(folder: Path, records: int = 200) -> list[str]:
    """Real data for MaxText's grain pipeline: an ArrayRecord file of pre-tokenized documents
    (tf.train.Example, "text": 129 token ids, each document its own), and a tokenizer (MaxText
    takes its pad id from one). The recipe's keys for it (a grain worker process each)."""
    import numpy as np
    from array_record.python.array_record_module import ArrayRecordWriter
    from maxtext.input_pipeline.protos import example_pb2

    from primus.testing.sft_data import write_tokenizer

    folder.mkdir()
    writer = ArrayRecordWriter(str(folder / "corpus.arrayrecord"), "group_size:1")
    for i in range(records):
        example = example_pb2.Example()
        tokens = np.random.default_rng(i).integers(1, 256, 129).tolist()
        example.features.feature["text"].int64_list.value.extend(tokens)
        writer.write(example.SerializeToString())
    writer.close()
    tokenizer = write_tokenizer(folder / "tokenizer", chat_template=None)
    return ["dataset_type=grain", "grain_file_type=arrayrecord", "tokenize_train_data=false",
            f"grain_train_files={folder / 'corpus.arrayrecord'}", "grain_worker_count=1",
            "tokenizer_type=huggingface", f"tokenizer_path={tokenizer}"]  # fmt: skip


def samples(folder: Path, rank: int) -> list[list[str]]:
    """Per batch the process loaded, the hashes of its rows (faults/sitecustomize.py)."""
    return [json.loads(line) for line in (folder / f"rank-{rank}.jsonl").read_text().splitlines()]


def test_a_resume_with_twice_the_processes_reads_each_remaining_sample_once(
    resized: Resized,
) -> None:
    """Across the resize (one process to two) and the two-process runs' own stop and resume."""
    run_dir, [_, to_launcher], whole, resumed = resized
    assert to_launcher.marker is not None
    last = to_launcher.marker["step"]  # the resized run's steps: 1-4 in one process, 5-last
    status = patch_status(run_dir)
    assert status["maxtext.grain_global_position"][0] == "applied"
    assert status["maxtext.grain_resharded_resume"][0] == "applied"
    assert "restoring from this run's directory step 3" in log(run_dir, 1)
    rank_0_batches, rank_1_batches = samples(resumed, 0), samples(resumed, 1)
    before = rank_0_batches[:4]
    after = list(zip(rank_0_batches[4:], rank_1_batches, strict=True))
    uninterrupted = samples(whole, 0)
    assert len(uninterrupted) == 20 and len(after) == last - 4 >= 4
    assert before == uninterrupted[:4]  # the same samples in the same order
    # step 5 + k of the resumed run: the two processes' rows are the samples of steps
    # 5 + 2k and 6 + 2k of the uninterrupted run (a global batch of 8 instead of 4)
    for k, (rank_0, rank_1) in enumerate(after):
        assert sorted(rank_0 + rank_1) == sorted(
            uninterrupted[4 + 2 * k] + uninterrupted[5 + 2 * k]
        )
    seen = [row for batch in before for row in batch] + [r for a, b in after for r in a + b]
    assert len(seen) == len(set(seen)) == 4 * 4 + len(after) * 8  # no sample twice
