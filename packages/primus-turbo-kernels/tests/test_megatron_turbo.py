"""Turbo in Megatron: real `primus train` runs of the tiny Llama recipe on CPU, with the
kernels running through Triton's interpreter in the training process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from primus.core.testing.runs import losses, patch_status, train_run

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
FEATURES = (
    "rms_norm", "swiglu", "rope", "attention", "cross_entropy", "optimizer", "grad_accum_fusion"
)  # fmt: skip
# The interpreter runs each Triton program in Python: short sequences keep a step near 2 s.
SMALL = ("seq_length=16", "max_position_embeddings=16", "micro_batch_size=2", "global_batch_size=2")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 30 steps without turbo and with it (fp32 on CPU)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    workspace = tmp_path_factory.mktemp("ws")
    try:
        return {
            name: train_run(
                RECIPE, workspace, f"exp_name={name}", "train_iters=30", *SMALL, *overrides
            )
            for name, overrides in (("plain", ()), ("turbo", ("turbo.enable=true",)))
        }
    finally:
        mp.undo()


def test_turbo_matches_plain_megatron(runs: dict[str, Path]) -> None:
    plain, turbo = losses(runs["plain"]), losses(runs["turbo"])
    assert sorted(turbo) == sorted(plain) == list(range(2, 31))
    for step, loss in plain.items():
        assert turbo[step] == pytest.approx(loss, rel=2e-3, abs=2e-3), step
    assert plain[30] < plain[2] - 0.2  # it trained


def test_patch_report_says_what_turbo_did(runs: dict[str, Path]) -> None:
    on, off = patch_status(runs["turbo"]), patch_status(runs["plain"])
    for feature in FEATURES:
        patch = f"megatron.turbo_{feature}"
        assert on[patch][0] == "applied", patch
        assert off[patch] == (
            "skipped",
            f"condition false: turbo.enable and turbo.{feature} (default true) are true",
        )
    log = (runs["turbo"] / "logs" / "rank-0.log").read_text()
    sites = dict(
        line.split("[turbo] ", 1)[1].split(": ", 1)
        for line in log.splitlines()
        if "[turbo] " in line
    )
    # every module that imported the upstream name, not only the one defining it
    assert "megatron.core.models.backends.DotProductAttention" in sites["attention"]
    assert "megatron.core.transformer.attention.apply_rotary_pos_emb" in sites["rope"]
    assert "megatron.core.optimizer.Adam" in sites["optimizer"]


def test_one_switch_turns_one_feature_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_dir = train_run(
        RECIPE, tmp_path, "exp_name=norope", "train_iters=3", *SMALL, "turbo.enable=true",
        "turbo.rope=false",
    )  # fmt: skip
    status = patch_status(run_dir)
    assert status["megatron.turbo_rope"][0] == "skipped"
    assert status["megatron.turbo_rms_norm"][0] == "applied"


def test_patches_list_shows_target_and_switch() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "primus.cli", "patches", "list", "--backend", "megatron",
         "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    patches = {p["id"]: p for p in json.loads(out)}
    rope = patches["megatron.turbo_rope"]
    assert (
        rope["target"] == "megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb"
    )
    assert rope["how to enable"] == (
        "turbo.enable and turbo.rope (default true) are true; upstream <0.20,>=0.19"
    )
    assert {f"megatron.turbo_{f}" for f in FEATURES} <= set(patches)


def test_tensor_parallel_keeps_the_vocab_parallel_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_dir = train_run(
        RECIPE, tmp_path, "exp_name=tp2", "train_iters=3", *SMALL, "tensor_model_parallel_size=2",
        "turbo.enable=true", nproc=2,
    )  # fmt: skip
    status = patch_status(run_dir)
    assert status["megatron.turbo_cross_entropy"] == (
        "skipped",
        "tensor parallel splits the logits: vocab-parallel loss",
    )
    assert status["megatron.turbo_attention"][0] == "applied"
    assert max(losses(run_dir)) == 3
