"""FP8 quantization (`primus.turbo.kernels.fp8_cast`): the cast kernel against PyTorch's cast,
and delayed scaling's amax history."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from primus.turbo.kernels.fp8_cast import E5M2, HISTORY, AmaxHistory, quantize_both


def test_delayed_scaling_scales_by_the_largest_amax_of_the_last_calls() -> None:
    """The first call is scaled by its own amax; every later one by the largest amax of the
    16 calls before it (a call above it saturates), which ages out after 16 more calls."""
    history = AmaxHistory(torch.device("cpu"))
    x = torch.linspace(-3.0, 3.0, 64).reshape(8, 8)
    top = torch.finfo(torch.float8_e4m3fn).max
    scales = []
    for factor in (1.0, 2.0, 0.5, *[0.5] * HISTORY):
        q, q_t, scale = quantize_both(x * factor, torch.float8_e4m3fn, history)
        assert torch.equal(q_t.float(), q.float().t())
        scales.append(scale.item() * top)
    # The 2x call saturated (3.0 was all it knew); 6.0 held for 16 calls, then the small ones.
    assert scales[:3] == pytest.approx([3.0, 3.0, 6.0])
    assert scales[-3:] == pytest.approx([6.0, 6.0, 1.5])
    q, _, scale = quantize_both(x * 2.0, torch.float8_e4m3fn, history)
    assert q.float().abs().max().item() == top  # saturated, not overflowed


def cast_cases() -> Iterator[torch.Tensor]:
    """A 1B MLP's output gradient (its transposed copy once came out with NaNs), a shape the
    tiles do not divide, and transposed views of both."""
    torch.manual_seed(0)
    for shape in ((8192, 8192), (1000, 600)):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 40
        yield from (x, x.t())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_cast_kernel_tracks_torchs_cast(dtype: torch.dtype) -> None:
    """`quantize_both`'s copy is PyTorch's cast within one FP8 step (the kernel's division may
    round differently) and its transposed copy is the copy transposed."""

    top = torch.finfo(dtype).max
    for source in cast_cases():
        scale = torch.linalg.vector_norm(source.float(), float("inf")) / top
        want = (source.float() / scale).clamp(-top, top).to(dtype).view(torch.uint8)
        q, q_t, got_scale = quantize_both(source, dtype)
        assert torch.equal(got_scale, scale)
        assert (q.view(torch.uint8).int() - want.int()).abs().max() <= 1  # neighbouring codes
        assert torch.equal(q_t.view(torch.uint8), q.view(torch.uint8).t().contiguous())


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.__version__ < "2.15",
    reason="only TorchTitan compiles the FP8 linears, on torch 2.15; Inductor of older torch "
    "fails to build the cast's graph (PassManager::run failed, seen on 2.11)",
)
def test_the_compiled_cast_writes_what_the_eager_cast_writes() -> None:

    compiled = torch.compile(quantize_both, fullgraph=True)
    for source in cast_cases():
        for got, want in zip(compiled(source, E5M2), quantize_both(source, E5M2), strict=True):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
def test_delayed_scaling_on_the_gpu_keeps_the_cpus_history_in_a_cuda_graph() -> None:
    """The roll and the recording cast (Triton), the later calls replayed from a CUDA graph,
    give the PyTorch path's scales and FP8 codes (within one step) over the same calls."""

    torch.manual_seed(0)
    xs = [(torch.randn(1000, 600) * f).bfloat16() for f in (1.0, 3.0, 0.2, 0.2, 5.0)]
    cpu, gpu = AmaxHistory(torch.device("cpu")), AmaxHistory(torch.device("cuda"))
    want = [quantize_both(x, E5M2, cpu) for x in xs]
    source = xs[0].cuda()
    got = [quantize_both(source, E5M2, gpu)]  # eager: primes the history, builds the kernels
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quantize_both(source, E5M2, gpu)
    for x in xs[1:]:
        source.copy_(x)
        graph.replay()
        got.append(tuple(t.clone() for t in out))
    for (q, q_t, scale), (q_cpu, q_t_cpu, scale_cpu) in zip(got, want, strict=True):
        assert scale.item() == scale_cpu.item()
        for a, b in ((q, q_cpu), (q_t, q_t_cpu)):
            assert (a.cpu().view(torch.uint8).int() - b.view(torch.uint8).int()).abs().max() <= 1
    assert torch.equal(gpu.amaxes.cpu(), cpu.amaxes)
