"""`primus train` through MaxText's training loop on CPU: real steps, real processes.

Each run is a `primus train pretrain` process on the tiny recipe (synthetic data: one fixed
random batch, which the model learns). Runs are shared across tests to keep JAX's start-up and
compile time (about 20 s a run) within CI's budget; the one-process runs whose imports are not
under test are forked by a process that imported MaxText once (conftest's `forks`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing import runs
from primus.testing.checkpoints import estimate_and_size
from primus.testing.faults import Forks
from primus.testing.files import run_writes, written_outside
from primus.testing.forked import forked
from primus.testing.golden import CPU_FP32, assert_matches_golden
from primus.testing.runs import (
    assert_loss_falls,
    losses,
    patch_status,
    primus_imports,
    step_metrics,
    train_run,
)
from primus.testing.shared import shared_train_run

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow
# The lr schedule spans 20 steps even when a run stops at 10, so a resumed run matches.
SCHEDULE = ("learning_rate_schedule_steps=20",)
CHECKPOINTS = ("enable_checkpointing=true", "checkpoint_period=5")


def train(workspace: Path, *overrides: str, nproc: int = 1) -> Path:
    return train_run(RECIPE, workspace, *SCHEDULE, *overrides, nproc=nproc)


def rank_log(run_dir: Path, rank: int = 0) -> str:
    return (run_dir / "logs" / f"rank-{rank}.log").read_text()


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> Path:
    with forked(forks, runs):
        return train(tmp_path_factory.mktemp("ws"), "exp_name=whole", "steps=20")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> tuple[Path, list[int]]:
    """10 steps with checkpoints, then the same experiment again to 20: (run dir, first steps)."""
    workspace = tmp_path_factory.mktemp("ws")
    keep = ("exp_name=resumed", *CHECKPOINTS)
    with forked(forks, runs):
        run_dir = train(workspace, *keep, "steps=10")
        first = [m["step"] for m in step_metrics(run_dir)]
        train(workspace, *keep, "steps=20")
    return run_dir, first


def assert_tokens_per_device(run_dir: Path, tokens: int = 4 * 128) -> None:
    """tokens/s/GPU x step seconds = per_device_batch_size x max_target_length, every step."""
    for m in step_metrics(run_dir):
        assert m["tokens_per_s_per_gpu"] * m["step_seconds"] == pytest.approx(tokens), m


def test_one_process_trains_and_reports(whole: Path) -> None:
    curve = losses(whole)
    assert sorted(curve) == list(range(1, 21))
    assert_loss_falls(curve, by=2.0)
    last = step_metrics(whole)[-1]
    assert last["total_steps"] == 20 and last["lr"] > 0
    assert last["tflops_per_gpu"] > 0
    assert_tokens_per_device(whole)
    assert last["mfu"] is None and last["peak_memory_gib"] is None  # a CPU: no peak known
    status = patch_status(whole)
    assert status["maxtext.cpu"] == ("applied", "hardware is cpu")
    assert status["maxtext.run_dir"] == ("applied", "base_output_directory is not set")
    for applied in (
        "maxtext.logging",
        "maxtext.config_errors",
        "maxtext.jax_distributed",
        "maxtext.step_metrics",
    ):
        assert status[applied][0] == "applied", applied
    log = rank_log(whole)
    assert "step 20/20 | loss" in log and "tokens/s/GPU" in log
    assert "MFU peak: unknown for no GPU, MFU n/a (set peak_tflops)" in log
    assert "completed step: 19, seconds:" in log  # MaxText's own step log, in Primus's logger
    assert "on 1 cpu device(s) in 1 process(es)" in log
    events = list((whole / "tensorboard").rglob("events.out.tfevents.*"))
    assert events
    assert any(b"primus/tokens_per_s_per_gpu" in e.read_bytes() for e in events)  # Primus's too
    assert not (whole / "checkpoints").exists()  # the module preset leaves checkpoints off


def test_the_loss_curve_matches_the_golden_one(whole: Path) -> None:
    assert_matches_golden(
        losses(whole),
        Path(__file__).parent / "golden" / "tiny-cpu.json",
        recipe="configs/maxtext/tiny-cpu.yaml " + " ".join((*SCHEDULE, "steps=20")),
        seed=0,  # MaxText's init_weights_seed and data_shuffle_seed (its base.yml; unset here)
        tolerance=CPU_FP32,
        packages=("jax", "jaxlib", "maxtext"),
    )


def test_two_processes_through_primus_launcher(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Also tests/test_multinode.py's reference (made once)."""
    run_dir = shared_train_run(tmp_path_factory, RECIPE, *SCHEDULE, "steps=12", nproc=2)
    assert [m["step"] for m in step_metrics(run_dir)] == list(range(1, 13))  # process 0 only
    assert_loss_falls(losses(run_dir))
    log = rank_log(run_dir)
    assert "[maxtext] JAX distributed: 2 processes, coordinator 127.0.0.1:" in log
    assert "on 2 cpu device(s) in 2 process(es)" in log
    assert "step 12/12 | loss" in rank_log(run_dir, 1)
    assert_tokens_per_device(run_dir)


def test_checkpoint_then_resume_matches_the_uninterrupted_run(
    resumed: tuple[Path, list[int]], whole: Path
) -> None:
    run_dir, first = resumed
    assert first == list(range(1, 11))
    # orbax steps count from 0: 0, 5 and the final 9 of the first run; 10, 15, 19 of the second
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    assert saved == [0, 5, 9, 10, 15, 19]
    estimate, size = estimate_and_size(RECIPE, [*CHECKPOINTS], run_dir / "checkpoints" / "5")
    assert 0.75 * size <= estimate <= 1.05 * size  # what the free-space check compares
    assert [m["step"] for m in step_metrics(run_dir)] == list(range(1, 21))  # repeats nothing
    assert "restoring from this run's directory step 9" in rank_log(run_dir)
    uninterrupted, continued = losses(whole), losses(run_dir)
    for step in (11, 15, 20):
        assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-5), step


def test_running_a_finished_run_again_says_so(
    resumed: tuple[Path, list[int]], forks: Forks
) -> None:
    run_dir, _ = resumed
    result = forks.run(
        ["train", "pretrain", "--config", str(RECIPE), *SCHEDULE, "exp_name=resumed",
         *CHECKPOINTS, "steps=20"], {"PRIMUS_WORKSPACE": str(run_dir.parents[2])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    said = "the run already finished at step 20: nothing was trained (raise steps above 20 to"
    assert said in result.stdout + result.stderr
    assert [m["step"] for m in step_metrics(run_dir)] == list(range(1, 21))


def test_a_mesh_the_devices_cannot_hold_is_a_config_error_at_the_key(tmp_path: Path) -> None:
    """A mesh checked only once JAX has started (two slices: a CPU launch's ICI mesh is checked
    before, test_fuzz). Also: a process that runs MaxText, which torch reaches only through
    tensorboardX and transformers, hides it (the adapter's unused_modules), though it is
    installed here."""
    result, imported = primus_imports(
        "train", "pretrain", "--config", str(RECIPE), "exp_name=mesh", "num_slices=2",
        PRIMUS_WORKSPACE=str(tmp_path),
    )  # fmt: skip
    assert "maxtext" in imported and "torch" not in imported, imported
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: cli (num_slices=2): MaxText cannot lay out its mesh on 1 device(s): " in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


@pytest.mark.gpu
def test_tiny_model_on_the_gpu(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "exp_name=gpu", "hardware=gpu", "dtype=bfloat16", "steps=30")
    assert_loss_falls(losses(run_dir))
    last = step_metrics(run_dir)[-1]
    assert last["mfu"] is not None and last["peak_memory_gib"] > 0
    assert patch_status(run_dir)["maxtext.cpu"][0] == "skipped"


def test_a_run_writes_only_its_run_directory_and_declared_caches(tmp_path: Path) -> None:
    """Files: HOME and TMPDIR point at fresh folders (run_writes), the
    repository and its environment are snapshotted too; __pycache__ is a declared cache."""
    # JAX's persistent compilation cache, MaxText's default `jax_cache_dir: ~/jax_cache`, is a
    # declared cache (docs/reliability.md, "Files: only the run directory").
    run_dir, new = run_writes(RECIPE, tmp_path, ROOT, "exp_name=files", *SCHEDULE, "steps=3")
    assert any(p.is_relative_to(run_dir) for p in new)
    assert written_outside(new, run_dir, caches=(tmp_path / "home" / "jax_cache",)) == []
