"""Turbo in TorchTitan: real `primus train` runs of the tiny Llama recipe on CPU, with the
kernels running through Triton's interpreter in the training process.
"""

from __future__ import annotations

import importlib
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from primus.testing.runs import losses, patch_status, primus

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"
FEATURES = ("rms_norm", "swiglu", "cross_entropy")
# The tiny model, one sequence of 16 tokens a step (Triton's interpreter runs a program at a
# time); the lr schedule spans 30 steps also in a shorter run, so its losses are comparable.
SHAPE = (
    "training.local_batch_size=1",
    "training.seq_len=16",
    "model.vocab_size=256",
    "metrics.log_freq=1",
    "lr_scheduler.total_steps=30",
)
RUNS = {
    "plain": ("training.steps=30",),
    "turbo": ("training.steps=30", "turbo.enable=true"),
    "compiled": ("training.steps=10", "turbo.enable=true", "compile.enable=true"),
}
# The compiled graphs (TorchTitan compiles each block with fullgraph=True, and the loss) and any
# graph break, on stderr.
TORCH_LOGS = "graph_code,graph_breaks"
# fp32 on CPU: the kernels give the reference losses to ~1e-6 (bf16 FSDP compute: ~3e-3).
TOLERANCE = 5e-5
pytestmark = pytest.mark.slow


def train(workspace: Path, name: str) -> tuple[Path, str]:
    """`primus train` of the recipe with Triton interpreting the kernels: (run dir, stderr)."""
    result = primus(
        "train", "pretrain", "--config", str(RECIPE), f"exp_name={name}", *SHAPE, *RUNS[name],
        PRIMUS_WORKSPACE=str(workspace), TRITON_INTERPRET="1", TORCH_LOGS=TORCH_LOGS,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return next(workspace.rglob(name)), result.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """The runs of RUNS, side by side (each is one process, mostly single-threaded)."""
    workspace = tmp_path_factory.mktemp("ws")
    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(lambda name: train(workspace, name), RUNS), strict=True))


def assert_same_losses(run: dict[int, float], reference: dict[int, float]) -> None:
    for step, loss in run.items():
        assert loss == pytest.approx(reference[step], abs=TOLERANCE), step


def test_turbo_matches_plain_torchtitan(runs: dict[str, tuple[Path, str]]) -> None:
    plain, turbo = losses(runs["plain"][0]), losses(runs["turbo"][0])
    assert sorted(turbo) == sorted(plain) == list(range(1, 31))
    assert_same_losses(turbo, plain)
    first_five = statistics.mean(plain[s] for s in range(1, 6))
    assert statistics.mean(plain[s] for s in range(26, 31)) < first_five - 0.5  # it trained


def test_patch_report_says_what_turbo_did(runs: dict[str, tuple[Path, str]]) -> None:
    on, off = patch_status(runs["turbo"][0]), patch_status(runs["plain"][0])
    for feature in FEATURES:
        patch = f"torchtitan.turbo_{feature}"
        condition = f"turbo.enable (default auto: true on a GPU) and turbo.{feature} (default true) are true"
        assert on[patch] == ("applied", condition)
        assert off[patch] == ("skipped", f"condition false: {condition}")
    log = (runs["turbo"][0] / "logs" / "rank-0.log").read_text()
    for line in (
        "[turbo] rms_norm: RMSNorm -> TurboRMSNorm (5 in the config)",
        "[turbo] swiglu: FeedForward -> TurboFeedForward (2 in the config)",
        "[turbo] cross_entropy: CrossEntropyLoss -> TurboCrossEntropyLoss (1 in the config)",
    ):
        assert line in log


def test_turbo_kernels_compile_into_torchtitans_graphs(runs: dict[str, tuple[Path, str]]) -> None:
    run_dir, stderr = runs["compiled"]
    compiled = losses(run_dir)
    assert sorted(compiled) == list(range(1, 11))
    assert_same_losses(compiled, losses(runs["plain"][0]))
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "Compiling each TransformerBlock with torch.compile" in log
    assert "Compiling the loss function with torch.compile" in log
    graphs = [line for line in stderr.splitlines() if "[__graph_code]" in line]
    for feature in FEATURES:  # its ops are primus_turbo::<feature>...
        assert any(f"torch.ops.primus_turbo.{feature}" in line for line in graphs), feature
    assert "[__graph_breaks]" not in stderr


@pytest.mark.parametrize(
    ("family", "norm"),
    [("llama3", "layers.0.ffn_norm"), ("qwen3", "layers.0.attention.qk_norm")],
)
def test_turbo_modules_keep_the_checkpoint_layout(family: str, norm: str) -> None:
    """The swapped model has the upstream's parameter names and shapes; swapping again is a
    no-op."""
    import torch
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.trainer import Trainer

    from primus.turbo.patches.torchtitan import swap_configs

    spec = importlib.import_module(f"torchtitan.models.{family}").model_registry("debugmodel")
    config = Trainer.Config(model_spec=spec, loss=ChunkedLossWrapper.Config())

    def build() -> Any:
        with torch.device("meta"):
            return spec.model.build()

    upstream = {name: p.shape for name, p in build().state_dict().items()}
    swapped = {feature: swap_configs(config, feature) for feature in FEATURES}
    assert f"model_spec.model.{norm}" in swapped["rms_norm"]
    assert "model_spec.model.norm" in swapped["rms_norm"]
    assert "model_spec.model.layers.0.feed_forward" in swapped["swiglu"]
    assert swapped["cross_entropy"] == ["loss.loss_fn"]
    assert not any(swap_configs(config, feature) for feature in FEATURES)
    model = build()
    assert {name: p.shape for name, p in model.state_dict().items()} == upstream
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"TurboRMSNorm", "TurboFeedForward"} <= kinds
    assert not {"RMSNorm", "FeedForward"} & kinds


def test_the_turbo_recipe_covers_llama3_2_1b(tmp_path: Path) -> None:
    recipe = RECIPE.parent / "llama3.2_1B-turbo.yaml"
    result = primus(
        "train",
        "pretrain",
        "--config",
        str(recipe),
        "--dry-run",
        "--full",
        PRIMUS_WORKSPACE=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for line in (
        "[turbo] rms_norm: RMSNorm -> TurboRMSNorm (33 in the config)",
        "[turbo] swiglu: FeedForward -> TurboFeedForward (16 in the config)",
        "[turbo] cross_entropy: CrossEntropyLoss -> TurboCrossEntropyLoss (1 in the config)",
    ):
        assert line in result.stdout + result.stderr


def test_patches_list_shows_target_and_switch() -> None:
    result = primus("patches", "list", "--backend", "torchtitan", "--format", "json")
    assert result.returncode == 0, result.stderr
    patches = {p["id"]: p for p in json.loads(result.stdout)}
    targets = {
        "rms_norm": "torchtitan.models.common.nn_modules.RMSNorm",
        "swiglu": "torchtitan.models.common.feed_forward.FeedForward",
        "cross_entropy": "torchtitan.components.loss.CrossEntropyLoss",
    }
    for feature, target in targets.items():
        patch = patches[f"torchtitan.turbo_{feature}"]
        assert patch["target"] == target
        assert patch["phase"] == "build_args"
        assert patch["how to enable"] == (
            f"turbo.enable (default auto: true on a GPU) and turbo.{feature} (default true) are true; upstream <0.4,>=0.3"
        )
