"""Turbo in Megatron: real `primus train` runs of the tiny Llama recipe on CPU, with the
kernels running through Triton's interpreter in the training process.

A run of one process runs in the test process (`primus.testing.in_process`; one whose kernels
go through the interpreter only where no GPU is visible), one of several in subprocesses; each
dry run is a process forked from one that imported torch and Megatron once
(`primus.testing.faults.Forks`): its output is the process's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from primus.testing import runs as run_helpers
from primus.testing import sft_runs
from primus.testing.checkpoints import dcp_state
from primus.testing.faults import Forks
from primus.testing.forked import forked
from primus.testing.in_process import in_process
from primus.testing.runs import losses, patch_status, train_run
from primus.testing.sft_runs import make_task, posttrain, published_dry_run, sft_experiment

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "megatron"
RECIPE = CONFIGS / "tiny-cpu.yaml"
GPU_RECIPE = CONFIGS / "llama3.2_1B-pretrain.yaml"
SFT_RECIPE = CONFIGS / "llama3.2_1B-sft.yaml"
SFT_CPU_RECIPE = CONFIGS / "sft-tiny-cpu.yaml"
FEATURES = (
    "rms_norm", "swiglu", "rope", "qkv_rope", "attention", "cross_entropy", "optimizer",
    "grad_accum_fusion",
)  # fmt: skip
# The interpreter runs each Triton program in Python: short sequences keep a step near 2 s.
SMALL = ("seq_length=16", "max_position_embeddings=16", "micro_batch_size=2", "global_batch_size=2")
# what the dry runs' fork server imports once
MEGATRON = ("megatron.training.training", "megatron.core.models.gpt")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def forks() -> Iterator[Forks]:
    """The dry runs' fork server."""
    with Forks(*MEGATRON) as server:
        yield server


def train_here(workspace: Path, *overrides: str) -> Path:
    """`train_run` of the tiny recipe (one process): in the test process where its kernels are
    Triton's interpreter's (no GPU: conftest.py), else in a subprocess (TRITON_INTERPRET
    defines them so there); its run directory."""
    if torch.cuda.is_available():
        return train_run(RECIPE, workspace, *overrides)
    with in_process(run_helpers):
        return train_run(RECIPE, workspace, *overrides)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 30 steps without turbo and with it (fp32 on CPU)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    workspace = tmp_path_factory.mktemp("ws")
    try:
        return {
            name: train_here(workspace, f"exp_name={name}", "train_iters=30", *SMALL, *overrides)
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
    assert on["megatron.turbo_cuda_graphs"] == ("skipped", "CUDA graphs need a GPU")
    for feature in (*FEATURES, "cuda_graphs"):
        patch = f"megatron.turbo_{feature}"
        assert on[patch][0] == "applied" or feature == "cuda_graphs", patch
        assert off[patch] == (
            "skipped",
            f"condition false: turbo.enable (default auto: true on a GPU) and turbo.{feature} (default true) are true",
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
    # query and key in one launch: Megatron's fused-QKV path, on the Triton kernel
    assert "megatron.core.transformer.attention.apply_fused_qkv_rotary_pos_emb" in sites["qkv_rope"]
    assert "megatron.core.optimizer.Adam" in sites["optimizer"]


def test_one_switch_turns_one_feature_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_dir = train_here(
        tmp_path, "exp_name=norope", "train_iters=3", *SMALL, "turbo.enable=true",
        "turbo.rope=false",
    )  # fmt: skip
    status = patch_status(run_dir)
    assert status["megatron.turbo_rope"][0] == "skipped"
    assert status["megatron.turbo_rms_norm"][0] == "applied"


@pytest.mark.parametrize(
    "overrides, graphs",
    [
        ((), "full_iteration"),
        (("turbo.cuda_graphs=false",), "none"),
        (("cuda_graph_impl=local",), "local"),  # the user's choice stays
    ],
)
def test_pretraining_on_a_gpu_replays_each_iteration_as_one_cuda_graph(
    forks: Forks, tmp_path: Path, overrides: tuple[str, ...], graphs: str
) -> None:
    """The GPU recipe's dry run (it builds Megatron's args on any machine)."""
    result = forks.run(
        ["train", "pretrain", "--dry-run", "--full", "--config", str(GPU_RECIPE),
         "turbo.enable=true", *overrides], {"PRIMUS_WORKSPACE": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"cuda_graph_impl: {graphs}\n" in result.stdout


@pytest.mark.parametrize(
    "overrides, apart",
    [
        ((), None),
        (("rotary_interleaved=true",), "rotary_interleaved"),
        (("qk_layernorm=true",), "QK norm"),
        (("tensor_model_parallel_size=4",), "fewer query groups than tensor-parallel ranks"),
    ],
)
def test_query_and_key_rotate_in_one_launch_where_the_layout_allows(
    forks: Forks, tmp_path: Path, overrides: tuple[str, ...], apart: str | None
) -> None:
    """Megatron's `fused_single_qkv_rope` asserts where its path does not apply: the patch
    turns it on only where it does, and says why not (dry runs of the tiny recipe)."""
    result = forks.run(
        ["train", "pretrain", "--dry-run", "--full", "--config", str(RECIPE), "turbo.enable=true",
         *overrides], {"PRIMUS_WORKSPACE": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("fused_single_qkv_rope: true\n" in result.stdout) == (apart is None)
    if apart:
        why = f"query and key rotated apart: {apart}"
        assert f"[turbo] qkv_rope: upstream kept: {why}\n" in result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_replaying_cuda_graphs_exit_after_their_last_step(tmp_path: Path) -> None:
    """Data parallel 2 with the distributed optimizer: the graphs captured NCCL work, and the
    process group's destruction hung until they were reset (pytorch/pytorch#115388)."""
    command = [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config",
               str(GPU_RECIPE), "--nproc-per-node", "2", "turbo.enable=true",
               "use_distributed_optimizer=true", "train_iters=6", "lr_warmup_iters=1"]  # fmt: skip
    env = {**os.environ, "PRIMUS_WORKSPACE": str(tmp_path)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cuda_graph_impl='full_iteration'" in result.stdout + result.stderr


def test_fine_tuning_and_dpo_replay_cuda_graphs(forks: Forks, tmp_path: Path) -> None:
    """Fine-tuning rows, packed or not, and DPO's pairs are `seq_length` long: one graph per
    iteration (on an H200 their losses equal those without, bit for bit)."""
    from primus.testing.dpo import write_preference_task

    task = make_task(tmp_path / "task")
    pairs = write_preference_task(tmp_path / "pairs")["train"]
    dpo = (f"sft.train={pairs}", "sft.packing=false", "sft.eval=null", "sft.eval_fraction=0",
           "dpo.beta=0.1", "turbo.enable=true")  # fmt: skip
    with forked(forks, sft_runs):
        _, stdout = published_dry_run(SFT_RECIPE, task, tmp_path / "sft", "turbo.enable=true")
        assert "cuda_graph_impl: full_iteration\n" in stdout
        _, stdout = published_dry_run(SFT_RECIPE, task, tmp_path / "dpo", *dpo)
        assert "cuda_graph_impl: full_iteration\n" in stdout


def test_packed_fine_tuning_applies_its_document_mask(tmp_path: Path) -> None:
    """Packed rows bring a block-diagonal mask, which turbo's causal SDPA would drop, letting
    the chats of a row attend to each other: SDPA applies the rows' masks, and the losses are
    plain Megatron's (rows of 128 tokens, several chats each). Turbo's other features are
    off: none of them touches the mask, and their Triton kernels would run through the
    interpreter here."""
    task = make_task(tmp_path / "task")
    others = [f"turbo.{f}=false" for f in FEATURES if f != "attention"]
    runs = {}
    for turbo in ("false", "true"):
        exp = sft_experiment(SFT_CPU_RECIPE, tmp_path / turbo, task, packing=True, seq_length=128)
        with in_process(sft_runs):
            runs[turbo] = posttrain(exp, "train_iters=2", "lr_warmup_iters=1", "log_interval=1",
                                    "micro_batch_size=8", "global_batch_size=8",
                                    f"turbo.enable={turbo}", *others)  # fmt: skip
    plain, turbo = losses(runs["false"]), losses(runs["true"])
    assert sorted(turbo) == sorted(plain) == [2]  # step 1 is not logged
    for step, loss in plain.items():
        assert turbo[step] == pytest.approx(loss, rel=2e-3, abs=2e-3), step
    assert patch_status(runs["true"])["megatron.turbo_attention"][0] == "applied"
    log = (runs["true"] / "logs" / "rank-0.log").read_text()
    assert "[turbo] attention (the rows' own masks): " in log


@pytest.mark.gpu
def test_packed_rows_attend_through_flex_as_through_the_dense_mask() -> None:
    """The GPU path of the rows' own masks (FlexAttention, GQA, two rows of different
    documents) against SDPA over the same mask in fp32: output and all three gradients."""
    from primus.backends.megatron.providers import document_mask
    from primus.turbo.megatron_layers import masked_flex_attention

    torch.manual_seed(0)
    length, heads, groups, dim = 1024, 8, 2, 64
    segments = [torch.repeat_interleave(torch.arange(n), length // n) for n in (4, 16)]
    mask = torch.stack([document_mask(s) for s in segments]).cuda()  # [2, 1, s, s]
    shapes = ((2, heads, length, dim), (2, groups, length, dim), (2, groups, length, dim))
    q, k, v = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in shapes)
    grad = torch.randn(2, heads, length, dim, device="cuda", dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = masked_flex_attention(*leaves, mask, dim**-0.5)
    got = (out, *torch.autograd.grad(out, leaves, grad))
    exact_leaves = [t.float().requires_grad_() for t in (q, k, v)]
    eq, ek, ev = exact_leaves
    repeat = heads // groups
    exact = torch.nn.functional.scaled_dot_product_attention(
        eq, ek.repeat_interleave(repeat, 1), ev.repeat_interleave(repeat, 1), attn_mask=~mask
    )
    want = (exact, *torch.autograd.grad(exact, exact_leaves, grad.float()))
    for name, a, e in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        error = ((a.float() - e).norm() / e.norm()).item()
        assert error < 2e-2, (name, error)


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
        "turbo.enable (default auto: true on a GPU) and turbo.rope (default true) are true; upstream <0.20,>=0.19"
    )
    assert {f"megatron.turbo_{f}" for f in FEATURES} <= set(patches)


@pytest.fixture(scope="module")
def tensor_parallel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Turbo over 2 tensor-parallel ranks (gloo): 3 steps saved, then steps 4-7 resumed from
    them without and with sequence parallelism (turbo's norm splits the sequence; Megatron's
    torch norm refuses to). Both start from the same weights: on the CPU, Megatron's random
    init draws differently with sequence parallelism on. The features that neither split the
    sequence nor meet the vocab-parallel loss are off: their Triton kernels would run through
    the interpreter here."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    workspace = tmp_path_factory.mktemp("tp")
    unrelated = [f"turbo.{f}=false" for f in ("swiglu", "rope", "qkv_rope", "optimizer")]
    tp2 = ("train_iters=7", *SMALL, "tensor_model_parallel_size=2", "turbo.enable=true",
           *unrelated)  # fmt: skip
    try:
        base = train_run(RECIPE, workspace, "exp_name=base", *tp2, "save_interval=3",
                         "exit_interval=3", nproc=2)  # fmt: skip
        resume = (*tp2, f"load={base / 'checkpoints'}", "save_interval=7")
        return {
            name: train_run(RECIPE, workspace, f"exp_name={name}", *resume, *overrides, nproc=2)
            for name, overrides in (("tp2", ()), ("tp2sp", ("sequence_parallel=true",)))
        }
    finally:
        mp.undo()


def test_tensor_parallel_keeps_the_vocab_parallel_loss(tensor_parallel: dict[str, Path]) -> None:
    status = patch_status(tensor_parallel["tp2"])
    assert status["megatron.turbo_cross_entropy"] == (
        "skipped",
        "tensor parallel splits the logits: vocab-parallel loss",
    )
    assert status["megatron.turbo_attention"][0] == "applied"
    assert max(losses(tensor_parallel["tp2"])) == 7


def test_sequence_parallel_trains_as_tensor_parallel_alone(
    tensor_parallel: dict[str, Path], tmp_path: Path
) -> None:
    """Same losses and, after 4 steps, the same weights. Without the norm weights' gradient
    summed over the tensor-parallel group (each rank sees half the sequence) the norm
    weights part by about 1e-3 while the losses stay within 1e-6."""
    alone, split = tensor_parallel["tp2"], tensor_parallel["tp2sp"]
    assert "sequence_parallel: true" in (split / "config.resolved.yaml").read_text()
    assert patch_status(split)["megatron.turbo_rms_norm"][0] == "applied"
    assert sorted(losses(split)) == sorted(losses(alone)) == [5, 6, 7]  # 4 only starts the clock
    for step, loss in losses(alone).items():
        assert losses(split)[step] == pytest.approx(loss, rel=1e-6), step
    weights = [
        dcp_state(run / "checkpoints" / "iter_0000007", tmp_path / f"{run.name}.pt")
        for run in (alone, split)
    ]
    model = ("decoder.", "embedding.", "output_layer.")
    names = [k for k, v in weights[0].items() if k.startswith(model) and torch.is_tensor(v)]
    assert sum("norm" in name for name in names) == 3  # final, and per layer qkv and fc1 stacks
    for name in names:
        assert torch.allclose(weights[1][name], weights[0][name], rtol=0, atol=1e-6), name


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (("normalization=LayerNorm", "turbo.enable=true"), "splits only RMSNorm, not LayerNorm"),
        (("turbo.enable=true", "turbo.rms_norm=false"), "the torch norm"),
    ],
)
def test_sequence_parallel_without_a_norm_that_splits_is_refused_before_the_run(
    forks: Forks, tmp_path: Path, overrides: tuple[str, ...], refused: str
) -> None:
    result = forks.run(
        ["train", "pretrain", "--dry-run", "--config", str(RECIPE),
         "tensor_model_parallel_size=2", "sequence_parallel=true", *overrides],
        {"PRIMUS_WORKSPACE": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert refused in result.stderr and "hint: set sequence_parallel: false" in result.stderr
    assert "Traceback" not in result.stderr
