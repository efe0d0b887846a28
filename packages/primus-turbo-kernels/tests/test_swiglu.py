"""SwiGLU kernels (separate halves and Megatron's packed fc1 output) against eager PyTorch on
fp32 copies."""

from __future__ import annotations

import pytest
import torch

from primus.turbo.kernels.swiglu import (
    swiglu,
    swiglu_bwd,
    swiglu_fwd,
    swiglu_packed,
    swiglu_packed_bwd,
    swiglu_packed_fwd,
    swiglu_packed_reference,
    swiglu_reference,
)

# Every output is one fp32 expression per element, rounded once to the dtype.
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
DTYPES = list(TOL)
SHAPES = [(3, 5, 127), (7, 2050), (1, 64), (4, 96)]  # [..., F]; the packed input is [..., 2F]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected, **TOL[dtype])


def _fp32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().float().requires_grad_() for t in tensors]


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (2 * torch.randn(shape, device=DEVICE)).to(dtype).requires_grad_()


def _check_swiglu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gate, up = _randn(*shape, dtype=dtype), _randn(*shape, dtype=dtype)
    y = swiglu(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape
    dy = torch.randn_like(y)
    y.backward(dy)
    g32, u32 = _fp32(gate, up)
    y32 = swiglu_reference(g32, u32)
    y32.backward(dy.float())
    _close(y, y32, dtype)
    _close(gate.grad, g32.grad, dtype)
    _close(up.grad, u32.grad, dtype)


def _check_packed(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _randn(*shape[:-1], 2 * shape[-1], dtype=dtype)
    y = swiglu_packed(x)
    assert y.dtype == dtype and y.shape == shape
    dy = torch.randn_like(y)
    y.backward(dy)
    assert x.grad.shape == x.shape
    (x32,) = _fp32(x)
    y32 = swiglu_packed_reference(x32)
    y32.backward(dy.float())
    _close(y, y32, dtype)
    _close(x.grad, x32.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check_swiglu(shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_packed_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check_packed(shape, dtype)


def test_non_contiguous_and_empty_inputs() -> None:
    torch.manual_seed(0)
    x = _randn(40, 6)  # the halves of chunk() as separate, strided inputs
    gate, up = torch.chunk(x.t(), 2, dim=0)
    swiglu(gate.t(), up.t()).sum().backward()
    (x32,) = _fp32(x)
    g32, u32 = torch.chunk(x32.t(), 2, dim=0)
    swiglu_reference(g32.t(), u32.t()).sum().backward()
    _close(x.grad, x32.grad, torch.float32)

    x.grad = x32.grad = None
    swiglu_packed(x.t()[:, ::2]).sum().backward()  # [6, 20], strided rows and columns
    swiglu_packed_reference(x32.t()[:, ::2]).sum().backward()
    _close(x.grad, x32.grad, torch.float32)

    empty = _randn(0, 3, 16)
    swiglu_packed(empty).sum().backward()
    assert swiglu_packed(empty).shape == (0, 3, 8) and empty.grad.shape == empty.shape


def test_compiles_without_graph_breaks() -> None:
    def mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu_packed(x * 2) + swiglu(gate, up).exp()

    torch.manual_seed(0)
    x, gate, up = _randn(2, 3, 48), _randn(2, 3, 24), _randn(2, 3, 24)
    compiled = torch.compile(mlp, fullgraph=True)
    out = compiled(x, gate, up)
    grads = torch.autograd.grad(out.square().sum(), (x, gate, up))
    want = mlp(x, gate, up)
    want_grads = torch.autograd.grad(want.square().sum(), (x, gate, up))
    _close(out, want, torch.float32)
    for got, expected in zip(grads, want_grads, strict=True):
        _close(got, expected, torch.float32)


def test_opcheck() -> None:
    torch.manual_seed(0)
    x, gate, up = _randn(5, 48), _randn(5, 24), _randn(5, 24)
    torch.library.opcheck(swiglu_fwd, (gate, up))
    torch.library.opcheck(swiglu_packed_fwd, (x,))
    dy, x, gate, up = torch.randn(5, 24, device=DEVICE), x.detach(), gate.detach(), up.detach()
    torch.library.opcheck(swiglu_bwd, (dy, gate, up))
    torch.library.opcheck(swiglu_packed_bwd, (dy, x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(4096, 4096), (8192, 2048), (2, 4096, 2048), (1024, 8192), (2048, 5120), (3000, 2050)]
)
def test_large_on_gpu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check_swiglu(shape, dtype)
    _check_packed(shape, dtype)


@pytest.mark.gpu
def test_inductor_schedules_the_kernels_itself() -> None:
    """On a GPU the ops are triton_ops: Inductor's code launches the SwiGLU kernels directly
    (no call back into the op), forward and backward."""
    from torch._inductor.utils import run_and_get_code

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return swiglu_packed(x * 2).square().sum()

    x = _randn(4, 96)
    compiled = torch.compile(mlp, fullgraph=True)
    _, code = run_and_get_code(lambda: compiled(x).backward())
    source = "\n".join(code)
    assert "primus_turbo" not in source
    assert "_fwd_kernel" in source and "_bwd_kernel" in source
    x32 = _fp32(x)[0]
    mlp(x32).backward()
    _close(x.grad, x32.grad, torch.float32)
