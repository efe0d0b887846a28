"""`primus train` through TorchTitan's Trainer on CPU: real training steps, real processes.

Each run is `primus train pretrain` on the tiny recipe (gloo on CPU): a subprocess for several
ranks and the files a run writes, in this process where only its losses and checkpoints are read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from primus.testing import runs
from primus.testing.checkpoints import estimate_and_size
from primus.testing.files import run_writes, written_outside
from primus.testing.golden import CPU_FP32, assert_matches_golden
from primus.testing.in_process import in_process
from primus.testing.runs import (
    assert_loss_falls,
    losses,
    patch_status,
    primus,
    step_metrics,
    train_run,
)
from primus.testing.shared import shared_train_run
from primus.testing.torchtitan import write_corpus

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RECIPE = CONFIGS / "torchtitan" / "tiny-cpu.yaml"
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow
# The lr schedule spans 20 steps even when a run stops at 10, so a resumed run matches.
SCHEDULE = ("lr_scheduler.total_steps=20", "metrics.log_freq=1")


def train(workspace: Path, *overrides: str, nproc: int = 1) -> Path:
    return train_run(RECIPE, workspace, *SCHEDULE, *overrides, nproc=nproc)


def train_here(workspace: Path, *overrides: str) -> Path:
    """`train` of one process, in this process."""
    with in_process(runs):
        return train(workspace, *overrides)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_here(tmp_path_factory.mktemp("ws"), "exp_name=whole", "training.steps=20")


def test_one_process_trains_and_reports(uninterrupted: Path) -> None:
    curve = losses(uninterrupted)
    assert sorted(curve) == list(range(1, 21))
    assert_loss_falls(curve)
    last = step_metrics(uninterrupted)[-1]
    assert last["tokens_per_s_per_gpu"] > 0 and last["tflops_per_gpu"] > 0
    assert last["mfu"] is None  # no peak is known for a CPU
    status = patch_status(uninterrupted)
    assert status["torchtitan.cpu"] == ("applied", "device is cpu, or auto and no GPU is visible")
    assert status["torchtitan.mock_data"][0] == "skipped"  # the recipe sets mock_data itself
    assert status["torchtitan.local_datasets"][0] == "skipped"
    for applied in ("torchtitan.logging", "torchtitan.run_dir", "torchtitan.step_metrics"):
        assert status[applied][0] == "applied", applied
    log = (uninterrupted / "logs" / "rank-0.log").read_text()
    assert "step 20/20 | loss" in log and "tokens/s/GPU" in log
    assert "MFU peak: unknown for no GPU, MFU n/a (set peak_tflops)" in log
    assert "Training starts at step 1" in log  # TorchTitan's own log, through Primus's logger
    # without lspci, TorchTitan's peak is looked up by the device's name, unwarned
    unwarned = "applied" if shutil.which("lspci") is None else "skipped"
    assert status["torchtitan.peak_flops_without_lspci"][0] == unwarned
    assert "Error running lspci" not in log


def test_the_loss_curve_matches_the_golden_one(uninterrupted: Path) -> None:
    assert_matches_golden(
        losses(uninterrupted),
        Path(__file__).parent / "golden" / "tiny-cpu.json",
        recipe="configs/torchtitan/tiny-cpu.yaml " + " ".join((*SCHEDULE, "training.steps=20")),
        seed=1234,  # the torchtitan_pretrain module preset's debug.seed
        tolerance=CPU_FP32,
        packages=("torch", "torchtitan"),
    )


@pytest.mark.parametrize(
    ("degree", "extra"),
    [
        ("data_parallel_shard_degree", ()),
        ("tensor_parallel_degree", ()),
        # rank 0 holds no loss under PP: Primus's line must carry the last stage's.
        # TorchTitan rejects PP while its (default-on) CUDA graphs are on.
        ("pipeline_parallel_degree", ("training.disable_cuda_graphs=true",)),
    ],
)
def test_two_processes_over_gloo(
    tmp_path_factory: pytest.TempPathFactory, degree: str, extra: tuple[str, ...]
) -> None:
    """The data-parallel run is also tests/test_multinode.py's reference (made once)."""
    overrides = (*SCHEDULE, "training.steps=12", f"parallelism.{degree}=2", *extra)
    run_dir = shared_train_run(tmp_path_factory, RECIPE, *overrides, nproc=2)
    assert_loss_falls(losses(run_dir))
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert f"{degree}: 2" in resolved
    assert (run_dir / "logs" / "rank-1.log").exists()


def test_a_combination_torchtitan_lacks_is_a_config_error(tmp_path: Path) -> None:
    """TorchTitan raises NotImplementedError while building (here: tied embeddings under PP)."""
    result = primus(
        "train", "pretrain", "--config", str(RECIPE), "--nproc-per-node", "2",
        "exp_name=tied", "parallelism.pipeline_parallel_degree=2", "model.tie_embeddings=true",
        "training.disable_cuda_graphs=true", PRIMUS_WORKSPACE=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]  # a worker failed on bad config
    assert (
        "error: TorchTitan does not support this configuration: "
        "Weight tying is not supported with Pipeline Parallel." in result.stderr
    ), result.stderr[-3000:]
    assert "Traceback (most recent call last)" not in result.stderr


def test_checkpoint_then_resume_matches_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: Path
) -> None:
    keep = ("exp_name=resumed", "checkpoint.enable=true", "checkpoint.interval=5")
    run_dir = train_here(tmp_path, *keep, "training.steps=10")
    checkpoints = run_dir / "checkpoint"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-10", "step-5"]
    estimate, size = estimate_and_size(RECIPE, list(keep), checkpoints / "step-10")
    assert 0.75 * size <= estimate <= 1.05 * size  # what the free-space check compares
    assert max(losses(run_dir)) == 10
    train_here(tmp_path, *keep, "training.steps=20")
    steps = [m["step"] for m in step_metrics(run_dir)]
    assert steps == list(range(1, 21))  # continues at 11, repeats nothing
    assert (checkpoints / "step-20").is_dir()
    whole, resumed = losses(uninterrupted), losses(run_dir)
    for step in (11, 15, 20):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-4), step
    train_here(tmp_path, *keep, "training.steps=20")  # the finished run again: exit 0, says so
    assert [m["step"] for m in step_metrics(run_dir)] == steps
    said = "the run already finished at step 20: nothing was trained (raise training.steps above 20"
    assert said in (run_dir / "logs" / "rank-0.log").read_text()


def test_trains_on_a_local_jsonl_dataset_with_a_local_tokenizer(tmp_path: Path) -> None:
    _, data = write_corpus(tmp_path)
    run_dir = train_here(tmp_path, "exp_name=jsonl", "training.steps=20", *data)
    assert_loss_falls(losses(run_dir), by=1.0)
    assert patch_status(run_dir)["torchtitan.local_datasets"][0] == "applied"


@pytest.mark.parametrize("attention", ["varlen", "sdpa"])
def test_other_attentions_follow_the_flex_attention_curve(
    tmp_path: Path, uninterrupted: Path, attention: str
) -> None:
    """`model.attn_backend: varlen` packs the batch's rows into one sequence of documents (on a
    GPU cuDNN's or FlashAttention's kernel takes it; here `torchtitan.cpu`'s dense path): each
    row attends to itself alone, as under FlexAttention, up to varlen's bf16 inputs. `sdpa` is
    causal over each row: the same where a row is one document, as the mock data's are."""
    run_dir = train_here(
        tmp_path, f"exp_name={attention}", "training.steps=20", f"model.attn_backend={attention}"
    )
    whole, curve = losses(uninterrupted), losses(run_dir)
    assert sorted(curve) == sorted(whole)
    if attention == "varlen":  # another attention ran (bf16 inputs: not bit-equal); sdpa on
        assert curve != whole  # the CPU is the dense path's SDPA under the causal mask itself
    # 3e-6 apart at most on 2026-11-27; a mask across the rows was 1e-4 apart at step 2
    for step in curve:
        assert curve[step] == pytest.approx(whole[step], rel=2e-5), step


def test_flash_attention_kernels_are_activated_only_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream asks for FA3 on any Hopper GPU and the model build fails where its package is
    missing; `torchtitan.flash_attention_impl` passes the request on only where the package
    imports. (No GPU here: the wrapper is handed upstream's Hopper and Blackwell answers.)"""
    from primus.backends.torchtitan.devices.patches import installed_only

    assert installed_only(lambda: "FA3")() is None
    assert installed_only(lambda: "FA4")() is None
    (tmp_path / "flash_attn_interface.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_only(lambda: "FA3")() == "FA3"
    assert installed_only(lambda: None)() is None


@pytest.mark.gpu
@pytest.mark.parametrize(
    "overrides",
    [(), ("compile.enable=true",), ("model.attn_backend=varlen",), ("model.attn_backend=sdpa",)],
    ids=["eager", "compiled", "varlen", "sdpa"],
)
def test_tiny_model_on_the_gpu(tmp_path: Path, overrides: tuple[str, ...]) -> None:
    run_dir = train(
        tmp_path,
        "exp_name=gpu",
        "device=cuda",
        "training.steps=30",
        "training.dtype=bfloat16",
        *overrides,
    )
    assert_loss_falls(losses(run_dir))
    last = step_metrics(run_dir)[-1]
    assert last["mfu"] is not None and last["peak_memory_gib"] > 0
    assert patch_status(run_dir)["torchtitan.cpu"][0] == "skipped"


def test_a_run_writes_only_its_run_directory_and_declared_caches(tmp_path: Path) -> None:
    """Files: HOME and TMPDIR point at fresh folders (run_writes), the
    repository and its environment are snapshotted too; __pycache__ is a declared cache."""
    run_dir, new = run_writes(
        RECIPE, tmp_path, ROOT, "exp_name=files", *SCHEDULE, "training.steps=3"
    )
    assert any(p.is_relative_to(run_dir) for p in new)
    assert written_outside(new, run_dir, caches=()) == []
