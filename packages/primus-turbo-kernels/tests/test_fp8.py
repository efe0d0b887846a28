"""FP8 linear layers: the kernel's numerics against the exact GEMM (on the CPU where this
torch's `_scaled_mm` runs there), the `turbo.fp8` switches, the refusal where the hardware has
no FP8, the TorchTitan wiring, and on a GPU a short Megatron run against the bf16 one."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import primus.turbo.fp8 as fp8
from primus.core.config.schema import registered_params
from primus.core.errors import ConfigError
from primus.core.patches import PatchContext
from primus.core.patches.registry import get_patch
from primus.core.runtime.resolution import load
from primus.testing.runs import losses, train_run
from primus.turbo.kernels.fp8_linear import RECIPES, fp8_linear
from primus.turbo.patches import megatron
from primus.turbo.switches import enabled, status

CONFIGS = Path(__file__).parents[3] / "configs"
GPU_RECIPE = CONFIGS / "megatron" / "llama3.2_1B-pretrain.yaml"
CPU_FP8 = fp8.cpu_has_fp8("tensorwise")
# Relative (L2) error of FP8 against the exact GEMM: e4m3 keeps 3 mantissa bits, e5m2 2.
TOL = {"out": 0.05, "grad": 0.1}


def context(recipe: str, *overrides: str) -> PatchContext:
    module = next(iter(load(CONFIGS / recipe, list(overrides)).modules.values()))
    return PatchContext(module.framework, "setup", None, "0", module.params)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def errors(device: str, m: int, k: int, n: int, recipe: str) -> dict[str, float]:
    """fp8_linear's output and gradients against the fp32 GEMM of the same bf16 values."""
    torch.manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(n, k, device=device) / k**0.5).bfloat16().requires_grad_()
    b = torch.randn(n, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    out = fp8_linear(x, w, b, recipe)
    assert out.dtype == torch.bfloat16
    got = (out, *torch.autograd.grad(out, (x, w, b), grad))
    leaves = [t.detach().float().requires_grad_() for t in (x, w, b)]
    exact = F.linear(*leaves)
    want = (exact, *torch.autograd.grad(exact, leaves, grad.float()))
    names = ("out", "input", "weight", "bias")
    return {name: rel(g, e) for name, g, e in zip(names, got, want, strict=True)}


def assert_fp8_close(errs: dict[str, float]) -> None:
    assert errs["out"] < TOL["out"], errs
    assert max(errs["input"], errs["weight"], errs["bias"]) < TOL["grad"], errs


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_linear_tracks_the_exact_gemm_on_the_cpu(recipe: str) -> None:
    if not fp8.cpu_has_fp8(recipe):
        pytest.skip(f"this torch has no {recipe} _scaled_mm on the CPU")
    assert_fp8_close(errors("cpu", 64, 128, 96, recipe))


def test_shapes_fp8_cannot_take_run_the_bf16_gemm() -> None:
    x, w = torch.randn(5, 24, dtype=torch.bfloat16), torch.randn(40, 24, dtype=torch.bfloat16)
    assert torch.equal(fp8_linear(x, w), F.linear(x, w))
    with pytest.raises(ValueError, match="FP8 recipe must be one of"):
        fp8_linear(x, w, recipe="mxfp8")


@pytest.mark.skipif(not CPU_FP8, reason="this torch has no _scaled_mm on the CPU")
def test_the_weights_fp8_copy_lasts_until_the_next_optimizer_step() -> None:
    w = torch.nn.Parameter(torch.randn(32, 32, dtype=torch.bfloat16))
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    fp8_linear(x, w, cache_weight=True).sum().backward()
    held = w._turbo_fp8  # type: ignore[attr-defined]
    fp8_linear(x, w, cache_weight=True).sum().backward()
    assert w._turbo_fp8 is held  # type: ignore[attr-defined]  # the next micro-batch reuses it
    torch.optim.SGD([w], lr=0.1).step()
    out = fp8_linear(x, w, cache_weight=True)
    assert w._turbo_fp8 is not held  # type: ignore[attr-defined]
    assert rel(out, F.linear(x, w)) < TOL["out"]


@pytest.mark.skipif(not CPU_FP8, reason="this torch has no _scaled_mm on the CPU")
def test_fp8_linear_traces_into_one_compiled_graph() -> None:
    """TorchTitan compiles each block with fullgraph=True: the FP8 linear (weight cache asked
    for, as TurboFP8Linear asks) traces without a break, gives the eager values and caches
    nothing on the weight (the compiled graph makes the weight's copies itself)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(48, 32, dtype=torch.bfloat16))
    x0 = torch.randn(2, 16, 32, dtype=torch.bfloat16)

    def step(x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, w, None, "tensorwise", cache_weight=True).float().square().sum()

    results = []
    for fn in (torch.compile(step, backend="aot_eager", fullgraph=True), step):
        x = x0.clone().requires_grad_()
        w.grad = None
        loss = fn(x)
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad))
        if fn is not step:
            assert not hasattr(w, "_turbo_fp8")
    for compiled, eager in zip(*results, strict=True):
        assert torch.equal(compiled, eager)


def test_fp8_is_off_unless_asked_and_says_its_recipe() -> None:
    recipe = "megatron/llama3.2_1B-pretrain.yaml"
    assert not enabled(context(recipe), "fp8")
    assert "fp8" not in status(context(recipe), {**megatron.FEATURES, **fp8.FP8})
    ctx = context(recipe, "turbo.fp8=true", "turbo.fp8_recipe=rowwise")
    assert enabled(ctx, "fp8")
    assert ", cuda_graphs, fp8;" in status(ctx, {**megatron.FEATURES, **fp8.FP8})
    assert ctx.params["turbo"]["fp8_recipe"] == "rowwise"
    assert not enabled(context(recipe, "turbo.fp8=true", "turbo.enable=false"), "fp8")
    for backend in ("megatron", "torchtitan"):
        spec = registered_params(backend).specs["turbo.fp8_recipe"]
        assert (spec.default, spec.type_error("rowwise")) == ("tensorwise", None)
        assert spec.type_error("mxfp8") == (
            "must be one of 'tensorwise', 'delayed', 'rowwise', got 'mxfp8'"
        )


@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
def test_a_gpu_without_fp8_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The patch's condition and handler on the 1B recipe, in process, as if on an A100."""
    if backend == "torchtitan":
        pytest.importorskip("torchtitan")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.version, "hip", None)
    ctx = context(f"{backend}/llama3.2_1B-pretrain.yaml", "turbo.fp8=true", "device=cuda")
    patch = get_patch(f"{backend}.turbo_fp8")
    assert patch is not None and patch.condition is not None and patch.condition(ctx)
    with pytest.raises(ConfigError) as refused:
        patch.handler(ctx)
    assert str(refused.value) == (
        "turbo.fp8: NVIDIA A100-SXM4-80GB (compute capability 8.0) has no FP8 tensor cores "
        "(FP8 needs a GPU of compute capability 8.9 or newer); set turbo.fp8: false"
    )


def test_the_cpu_is_refused_where_torch_has_no_fp8_gemm_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = context("megatron/tiny-cpu.yaml", "turbo.enable=true", "turbo.fp8=true")
    assert fp8.fp8_recipe(ctx) == "tensorwise" or not CPU_FP8
    monkeypatch.setattr(fp8, "cpu_has_fp8", lambda recipe: False)
    with pytest.raises(ConfigError, match=r"^turbo\.fp8: torch .* has no tensor-wise FP8 GEMM on"):
        fp8.fp8_recipe(ctx)


def test_torchtitan_refuses_delayed_scaling_under_compile() -> None:
    """The amax history lives outside the compiled graph: refused at setup, in one line."""
    pytest.importorskip("torchtitan")
    ctx = context(
        "torchtitan/tiny-cpu.yaml", "turbo.enable=true", "turbo.fp8=true",
        "turbo.fp8_recipe=delayed", "compile.enable=true",
    )  # fmt: skip
    patch = get_patch("torchtitan.turbo_fp8")
    assert patch is not None
    with pytest.raises(ConfigError, match=r"^turbo\.fp8_recipe: delayed keeps its amax history"):
        patch.handler(ctx)


def test_torchtitans_float8_without_torchao_trains_turbos_fp8() -> None:
    """The workspace has no torchao: with turbo on, `model.float8` becomes `turbo.fp8` (in
    process, the 1B recipe on a GPU); with turbo off, TorchTitan's own refusal stays."""
    ctx = context("torchtitan/llama3.2_1B-pretrain.yaml", "model.float8=true", "device=cuda")
    mapping, fp8_patch = get_patch("torchtitan.turbo_float8"), get_patch("torchtitan.turbo_fp8")
    assert mapping is not None and mapping.condition is not None
    assert fp8_patch is not None and fp8_patch.condition is not None
    assert mapping.condition(ctx) and not fp8_patch.condition(ctx)
    with ctx.running(mapping.id):
        mapping.handler(ctx)
    assert ctx.params["model"]["float8"] is False and ctx.params["turbo"]["fp8"] is True
    assert fp8_patch.condition(ctx)
    off = context("torchtitan/llama3.2_1B-pretrain.yaml", "model.float8=true", "turbo.enable=false")
    assert not mapping.condition(off)


@pytest.mark.skipif(not CPU_FP8, reason="this torch has no _scaled_mm on the CPU")
def test_torchtitan_runs_the_inner_blocks_linears_in_fp8() -> None:
    """The swap on TorchTitan's debug Llama (6 blocks), and one swapped layer run on the CPU
    (TorchTitan's training needs a newer torch than the GPU machines have)."""
    model_registry = pytest.importorskip("torchtitan.models.llama3").model_registry

    from primus.turbo.patches.torchtitan import swap_fp8_linears

    model = model_registry("debugmodel").model
    swapped = swap_fp8_linears(model, "rowwise")
    linears = (
        "attention.qkv_linear.wqkv",
        "attention.wo",
        *(f"feed_forward.w{i}" for i in (1, 2, 3)),
    )
    assert swapped == [f"layers.{i}.{name}" for i in range(1, 5) for name in linears]
    assert swap_fp8_linears(model, "rowwise") == []  # applied twice: nothing left to swap
    config = model.layers[2].feed_forward.w1
    assert type(config).__name__ == "Config" and config.fp8_recipe == "rowwise"
    layer = config.build().to(torch.bfloat16)
    x = torch.randn(2, 16, config.in_features, dtype=torch.bfloat16)
    assert rel(layer(x), F.linear(x, layer.weight)) < TOL["out"]


def sequence_parallel_rank(rank: int, store: str, recipe: str, results: Any) -> None:
    """One of two tensor-parallel ranks (gloo) of a column-parallel layer under sequence
    parallelism: its slice of the sequence in, its slice of the output features out; puts
    (rank, errors against the exact GEMMs, whether the FP8 path ran and a second backward gave
    the first's gradients) on `results`."""
    from primus.turbo.megatron_fp8 import turbo_linear

    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2
    )
    try:
        torch.manual_seed(0)  # every rank draws the same whole tensors
        s, b, k, n = 32, 2, 64, 48  # sequence, batch, in, out features per rank
        x_all = torch.randn(s, b, k, dtype=torch.bfloat16)
        w_all = (torch.randn(2 * n, k) / k**0.5).bfloat16()
        g_all = torch.randn(s, b, 2 * n, dtype=torch.bfloat16)
        x = x_all.chunk(2)[rank].clone().requires_grad_()
        w = torch.nn.Parameter(w_all.chunk(2)[rank].clone())
        w.turbo_fp8 = recipe  # type: ignore[attr-defined]  # what tag_linears marks
        g = g_all[..., rank * n : (rank + 1) * n]
        group = torch.distributed.group.WORLD
        out = turbo_linear(x, w, None, False, False, True, tp_group=group)
        got = (out, *torch.autograd.grad(out, (x, w), g, retain_graph=True))
        again = torch.autograd.grad(out, (x, w), g)  # the backward leaves what it saved as it was
        same = all(torch.equal(a, b) for a, b in zip(got[1:], again, strict=True))
        exact_out = x_all.float() @ w.float().t()
        exact_input = (g_all.float() @ w_all.float()).chunk(2)[rank]
        exact_weight = g.float().reshape(-1, n).t() @ x_all.float().reshape(-1, k)
        want = (exact_out, exact_input, exact_weight)
        names = ("out", "input", "weight")
        errs = {name: rel(a, e) for name, a, e in zip(names, got, want, strict=True)}
        results.put((rank, errs, hasattr(w, "_turbo_fp8") and same))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("recipe", RECIPES)
def test_sequence_parallel_linears_gather_and_scatter_around_the_fp8_gemms(
    tmp_path: Path, recipe: str
) -> None:
    """Two processes forked from this one: each rank's output, input gradient (its slice of
    the sequence) and weight gradient match the exact GEMMs over the whole sequence."""
    if not fp8.cpu_has_fp8(recipe):
        pytest.skip(f"this torch has no {recipe} _scaled_mm on the CPU")
    pytest.importorskip("megatron.core")
    import primus.turbo.megatron_fp8  # noqa: F401  # imported once, before the fork

    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    ranks = [
        fork.Process(
            target=sequence_parallel_rank, args=(r, str(tmp_path / "store"), recipe, results)
        )
        for r in (0, 1)
    ]
    for process in ranks:
        process.start()
    for process in ranks:  # their results are a few numbers: the queue does not block them
        process.join(120)
        assert process.exitcode == 0
    for rank, errs, ran_fp8_twice in sorted(results.get(timeout=5) for _ in ranks):
        assert ran_fp8_twice, rank
        assert_fp8_close({**errs, "bias": 0.0})


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_linear_tracks_the_exact_gemm_at_llama_shapes(recipe: str) -> None:
    """Llama 3.2 1B's MLP GEMMs at 4096 tokens: hidden 2048, FFN 8192."""
    assert_fp8_close(errors("cuda", 4096, 2048, 8192, recipe))
    assert_fp8_close(errors("cuda", 4096, 8192, 2048, recipe))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_cuda_graph_casts_the_weight_it_replays_with(recipe: str) -> None:
    """A graph captured after an eager forward of the same step (Megatron's evaluation: warm-up
    iterations, then the capture) casts the weight itself: replayed after an optimizer step it
    computes with that step's weight, not the capture's."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) / 512**0.5)
    x = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        fp8_linear(x, w, recipe=recipe, cache_weight=True)  # the warm-up: the copy is cached
        with torch.cuda.graph(graph):
            out = fp8_linear(x, w, recipe=recipe, cache_weight=True)
    w.grad = torch.randn_like(w)
    torch.optim.SGD([w], lr=1.0).step()
    graph.replay()
    assert rel(out, F.linear(x, w.detach())) < TOL["out"]


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param((), id="one-gpu"),
        pytest.param(
            ("tensor_model_parallel_size=2", "sequence_parallel=true"),
            id="tensor-and-sequence-parallel",
            marks=TWO_GPUS,
        ),
    ],
)
def test_megatron_fp8_training_tracks_bf16(tmp_path: Path, layout: tuple[str, ...]) -> None:
    """Four layers of the 1B recipe (the middle two FP8), 20 steps with turbo on (its CUDA
    graphs), current and delayed scaling, against the same run in bf16 (the benchmark compares
    the recipes on the whole 1B model)."""
    shape = ("num_layers=4", "seq_length=1024", "max_position_embeddings=1024",
             "train_iters=20", "log_interval=1", "lr_warmup_iters=5", *layout)  # fmt: skip
    nproc = 2 if layout else 1
    bf16, *fp8_runs = (
        losses(train_run(GPU_RECIPE, tmp_path, f"exp_name={name}", *shape, *extra, nproc=nproc))
        for name, extra in (
            ("bf16", ()),
            ("fp8", ("turbo.fp8=true",)),
            ("delayed", ("turbo.fp8=true", "turbo.fp8_recipe=delayed")),
        )
    )
    assert bf16[20] < bf16[2] - 1.0  # it trained
    for fp8_run in fp8_runs:
        assert max(abs(fp8_run[s] - loss) / loss for s, loss in bf16.items()) < 0.03, (
            fp8_run,
            bf16,
        )
