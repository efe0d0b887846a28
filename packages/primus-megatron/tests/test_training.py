"""`primus train` through megatron.training on CPU: real training steps, real processes.

Each run is `primus train pretrain` on the tiny recipe (gloo on CPU): a run of one process on
the CPU in the test process (`primus.testing.in_process`: torch and Megatron are imported once);
one of several processes, one on the GPU, or one whose writes are under test, a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus.testing import runs
from primus.testing.checkpoints import estimate_and_size
from primus.testing.files import run_writes, written_outside
from primus.testing.golden import CPU_FP32, assert_matches_golden
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import assert_loss_falls, losses, primus, train_run
from primus.testing.shared import shared_train_run

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
RECIPE = CONFIGS / "megatron" / "tiny-cpu.yaml"
pytestmark = pytest.mark.slow


def train(workspace: Path, *overrides: str, nproc: int = 1, config: Path = RECIPE) -> Path:
    return train_run(config, workspace, *overrides, nproc=nproc)


def train_here(workspace: Path, *overrides: str, config: Path = RECIPE) -> Path:
    """`train` of one process, in this process."""
    with in_process(runs):
        return train(workspace, *overrides, config=config)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_here(tmp_path_factory.mktemp("ws"), "exp_name=whole", "train_iters=20")


def test_values_a_patch_set_carry_the_patch_as_their_origin(
    uninterrupted: Path, tmp_path: Path
) -> None:
    resolved = (uninterrupted / "config.resolved.yaml").read_text()
    assert "mock_data: true  # patch megatron.mock_data" in resolved
    report = json.loads((uninterrupted / "patch_report.json").read_text())
    mock = next(p for p in report["patches"] if p["id"] == "megatron.mock_data")
    assert mock["params_set"][0] == {
        "key": "mock_data",
        "value": True,
        "reason": "no data_path given (set data_path to train on data)",
    }
    shown = primus(
        "config", "show", str(RECIPE), "--provenance", "--after-patches",
        PRIMUS_WORKSPACE=str(tmp_path),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "mock_data: true  # patch megatron.mock_data" in shown.stdout
    plain = primus("config", "show", str(RECIPE), "--provenance", PRIMUS_WORKSPACE=str(tmp_path))
    assert "patch megatron" not in plain.stdout  # without --after-patches: the files' values


def test_one_process_trains_and_reports(uninterrupted: Path) -> None:
    curve = losses(uninterrupted)
    assert sorted(curve) == list(range(2, 21))  # the first step only starts the clock
    assert_loss_falls(curve)
    metrics = json.loads((uninterrupted / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["tokens_per_s_per_gpu"] > 0 and metrics["tflops_per_gpu"] > 0
    assert metrics["mfu"] is None  # no peak is known for a CPU
    report = json.loads((uninterrupted / "patch_report.json").read_text())
    status = {p["id"]: (p["status"], p["reason"]) for p in report["patches"]}
    assert status["megatron.cpu"] == ("applied", "device is cpu, or auto and no GPU is visible")
    assert status["megatron.mock_data"][0] == "applied"
    assert status["megatron.cuda_device_max_connections"][0] == "skipped"
    assert status["megatron.step_metrics"][0] == "applied"
    assert report["summary"]["failed"] == 0 and report["summary"]["not run"] == 0
    log = (uninterrupted / "logs" / "rank-0.log").read_text()
    assert "step 20/20 | loss" in log and "tokens/s/GPU" in log
    assert "MFU peak: unknown for no GPU, MFU n/a (set peak_tflops)" in log


def test_the_loss_curve_matches_the_golden_one(uninterrupted: Path) -> None:
    assert_matches_golden(
        losses(uninterrupted),
        Path(__file__).parent / "golden" / "tiny-cpu.json",
        recipe="configs/megatron/tiny-cpu.yaml train_iters=20",
        seed=1234,  # the megatron_pretrain module preset's
        tolerance=CPU_FP32,
        packages=("torch", "megatron-core"),
    )


@pytest.mark.parametrize("parallel", ["data_parallel", "tensor_model_parallel_size=2"])
def test_two_processes_over_gloo(tmp_path_factory: pytest.TempPathFactory, parallel: str) -> None:
    """The data-parallel run is also tests/test_multinode.py's reference (made once)."""
    overrides = [] if parallel == "data_parallel" else [parallel]
    run_dir = shared_train_run(tmp_path_factory, RECIPE, "train_iters=12", *overrides, nproc=2)
    assert_loss_falls(losses(run_dir))
    config = (run_dir / "config.resolved.yaml").read_text()
    assert ("tensor_model_parallel_size: 2" in config) == bool(overrides)


def test_checkpoint_then_resume_matches_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: Path
) -> None:
    # Stop at step 10 (Megatron's exit_interval) with checkpoints every 5, then run again.
    run_dir = train_here(
        tmp_path, "exp_name=resumed", "train_iters=20", "save_interval=5", "exit_interval=10"
    )
    tracker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == "10"
    estimate, size = estimate_and_size(
        RECIPE, ["train_iters=20", "save_interval=5"], run_dir / "checkpoints" / "iter_0000010"
    )
    assert 0.75 * size <= estimate <= 1.05 * size  # what the free-space check compares
    assert max(losses(run_dir)) == 10
    train_here(tmp_path, "exp_name=resumed", "train_iters=20", "save_interval=5")
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(2, 11)) + list(range(12, 21))  # continues at 11, repeats nothing
    assert tracker.read_text().strip() == "20"
    # A file of the latest checkpoint cut short: one error naming it, then, as its hint says,
    # that checkpoint moved away and the run resumed from the one before
    latest = run_dir / "checkpoints" / "iter_0000020"
    shard = max(latest.glob("*.distcp"), key=lambda path: path.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    resume = ("train", "pretrain", "--config", str(RECIPE), "exp_name=resumed", "train_iters=20")
    with in_process():
        damaged = primus_here(*resume, PRIMUS_WORKSPACE=str(tmp_path))
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-3000:]
    assert f"error: the checkpoint {latest} cannot be read (" in damaged.stderr
    assert f"hint: a file in it may be damaged or cut short: move {latest} out of" in damaged.stderr
    (latest / ".metadata").write_bytes(b"\x80\x04garbage")  # its DCP index damaged: the same
    with in_process():
        damaged = primus_here(*resume, PRIMUS_WORKSPACE=str(tmp_path))
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-3000:]
    assert f"error: the checkpoint {latest} cannot be read (UnpicklingError: " in damaged.stderr
    latest.rename(tmp_path / "damaged")
    train_here(tmp_path, *resume[4:])
    assert "resumed from" in (log := (run_dir / "logs" / "rank-0.log").read_text())
    assert "iter_0000015 (iteration 15)" in log.rsplit("resumed from", 1)[1]
    whole, resumed = losses(uninterrupted), losses(run_dir)
    for step in (12, 15, 20):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-4), step


def test_mixtral_style_moe(tmp_path: Path) -> None:
    run_dir = train_here(
        tmp_path, "modules.pre_trainer.model=tiny_moe", "exp_name=moe", "train_iters=12"
    )
    assert_loss_falls(losses(run_dir))
    assert "num_experts: 4" in (run_dir / "config.resolved.yaml").read_text()


@pytest.mark.gpu
def test_tiny_model_on_the_gpu(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "exp_name=gpu", "device=cuda", "bf16=true", "train_iters=30")
    assert_loss_falls(losses(run_dir))
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["mfu"] is not None and last["peak_memory_gib"] > 0
    report = json.loads((run_dir / "patch_report.json").read_text())
    cpu = next(p for p in report["patches"] if p["id"] == "megatron.cpu")
    assert cpu["status"] == "skipped"


def test_the_readme_quickstart_trains_as_shipped(tmp_path: Path) -> None:
    import torch

    # device auto: where a GPU is visible, a subprocess (CUDA not started in the test process)
    run = train if torch.cuda.is_available() else train_here
    run_dir = run(tmp_path, "exp_name=quickstart", config=CONFIGS / "quickstart.yaml")
    curve = losses(run_dir)
    assert sorted(curve) == list(range(20, 201, 20))  # every log_interval, to the last step
    assert curve[200] < curve[20] - 2.0, curve  # visibly falling
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "step 200/200 | loss" in log and "tokens/s/GPU" in log


def test_a_run_writes_only_its_run_directory_and_declared_caches(tmp_path: Path) -> None:
    """Files: HOME and TMPDIR point at fresh folders (run_writes), the
    repository and its environment are snapshotted too; __pycache__ is a declared cache."""
    # Mock data (the recipe's): no dataset index cache is built.
    run_dir, new = run_writes(RECIPE, tmp_path, ROOT, "exp_name=files", "train_iters=3")
    assert any(p.is_relative_to(run_dir) for p in new)
    assert written_outside(new, run_dir) == []
