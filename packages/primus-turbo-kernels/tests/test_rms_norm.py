"""RMSNorm and residual-add + RMSNorm kernels against eager PyTorch on fp32 copies."""

from __future__ import annotations

import math

import pytest
import torch

from primus.turbo.kernels import rms_norm as rms_norm_module
from primus.turbo.kernels.rms_norm import (
    RMSNorm,
    add_rms_norm,
    add_rms_norm_fwd,
    add_rms_norm_reference,
    rms_norm,
    rms_norm_bwd,
    rms_norm_fwd,
    rms_norm_reference,
)

# Outputs and dx are rounded once to the dtype; weight grads sum over rows, so their atol
# grows with sqrt(rows) (see `_close`).
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
DTYPES = list(TOL)
SHAPES = [(3, 5, 127), (7, 2050), (1, 64), (4, 96)]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, rows: int = 1) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(
        actual.float(), expected, atol=tol["atol"] * math.sqrt(rows), rtol=tol["rtol"]
    )


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, weight_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True)
    weight = 1 + 0.1 * torch.randn(shape[-1], device=DEVICE)
    return x, weight.to(weight_dtype or dtype).requires_grad_()


def _fp32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().float().requires_grad_() for t in tensors]


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, weight = _inputs(shape, dtype)
    y = rms_norm(x, weight)
    assert y.dtype == dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    y.backward(dy)

    x32, w32 = _fp32(x, weight)
    y32 = rms_norm_reference(x32, w32)
    y32.backward(dy.float())
    _close(y, y32, dtype)
    _close(x.grad, x32.grad, dtype)
    _close(weight.grad, w32.grad, dtype, _rows(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, weight = _inputs(shape, dtype)
    residual = torch.randn_like(x).requires_grad_()
    y, h = add_rms_norm(x, residual, weight)
    assert y.dtype == h.dtype == dtype
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward([y, h], [dy, dh])

    x32, r32, w32 = _fp32(x, residual, weight)
    y32, h32 = add_rms_norm_reference(x32, r32, w32)
    torch.autograd.backward([y32, h32], [dy.float(), dh.float()])
    _close(y, y32, dtype)
    _close(h, h32, dtype)
    _close(x.grad, x32.grad, dtype)
    _close(residual.grad, r32.grad, dtype)
    _close(weight.grad, w32.grad, dtype, _rows(shape))


def test_add_rms_norm_grad_through_the_norm_only() -> None:
    """With h unused, the grad of the sum is the norm's alone."""
    torch.manual_seed(0)
    x, weight = _inputs((6, 80), torch.float32)
    residual = torch.randn_like(x).requires_grad_()
    add_rms_norm(x, residual, weight)[0].sum().backward()
    x32, r32, w32 = _fp32(x, residual, weight)
    add_rms_norm_reference(x32, r32, w32)[0].sum().backward()
    for got, want in ((x.grad, x32.grad), (residual.grad, r32.grad), (weight.grad, w32.grad)):
        _close(got, want, torch.float32, 6)


def test_gpu_launch_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward split a GPU gets (programs from the SM count, several row blocks each,
    a tail program with fewer) computes the same grads."""
    monkeypatch.setattr(rms_norm_module, "interpreting", lambda: False)
    monkeypatch.setattr(rms_norm_module, "_device", lambda device: (3, 1 << 20))
    torch.manual_seed(0)
    x, weight = _inputs((40, 2050), torch.float32)  # 3 programs of 14 rows, the last 12
    residual = torch.randn_like(x).requires_grad_()
    y, h = add_rms_norm(x, residual, weight)
    (y * h).sum().backward()
    x32, r32, w32 = _fp32(x, residual, weight)
    y32, h32 = add_rms_norm_reference(x32, r32, w32)
    (y32 * h32).sum().backward()
    _close(x.grad, x32.grad, torch.float32)
    _close(weight.grad, w32.grad, torch.float32, 40)


def test_fp32_weight_with_bf16_input() -> None:
    torch.manual_seed(0)
    x, weight = _inputs((5, 200), torch.bfloat16, torch.float32)
    y = rms_norm(x, weight, eps=1e-5)
    assert y.dtype == torch.bfloat16
    y.backward(torch.ones_like(y))
    assert weight.grad.dtype == torch.float32
    x32, w32 = _fp32(x, weight)
    y32 = rms_norm_reference(x32, w32, eps=1e-5)
    y32.backward(torch.ones_like(y32))
    _close(y, y32, torch.bfloat16)
    _close(x.grad, x32.grad, torch.bfloat16)
    _close(weight.grad, w32.grad, torch.bfloat16, 5)


def test_non_contiguous_input() -> None:
    torch.manual_seed(0)
    base = torch.randn(64, 3, 7, device=DEVICE, requires_grad=True)
    weight = torch.randn(64, device=DEVICE, requires_grad=True)
    rms_norm(base.transpose(0, 2), weight).sum().backward()  # [7, 3, 64], H strided
    b32, w32 = _fp32(base, weight)
    rms_norm_reference(b32.transpose(0, 2), w32).sum().backward()
    _close(base.grad, b32.grad, torch.float32)
    _close(weight.grad, w32.grad, torch.float32, 21)


def test_module() -> None:
    norm = RMSNorm(96, eps=1e-5, device=DEVICE, dtype=torch.bfloat16)
    assert norm.weight.dtype == torch.bfloat16
    torch.testing.assert_close(norm.weight, torch.ones_like(norm.weight))
    x = torch.randn(2, 3, 96, device=DEVICE, dtype=torch.bfloat16)
    torch.testing.assert_close(norm(x), rms_norm(x, norm.weight, 1e-5))
    assert "96, eps=1e-05" in repr(norm)


def test_compiles_without_graph_breaks() -> None:
    def block(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y, h = add_rms_norm(x, residual, weight)
        return rms_norm(y * 2, weight) + h

    torch.manual_seed(0)
    x, weight = _inputs((2, 3, 40), torch.float32)
    residual = torch.randn_like(x).requires_grad_()
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x, residual, weight)
    grads = torch.autograd.grad(out.square().sum(), (x, residual, weight))
    want = block(x, residual, weight)
    want_grads = torch.autograd.grad(want.square().sum(), (x, residual, weight))
    _close(out, want, torch.float32)
    for got, expected in zip(grads, want_grads, strict=True):
        _close(got, expected, torch.float32, 6)


def test_opcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 48, device=DEVICE, requires_grad=True)
    residual = torch.randn_like(x, requires_grad=True)
    weight = torch.randn(48, device=DEVICE, requires_grad=True)
    torch.library.opcheck(rms_norm_fwd, (x, weight, 1e-6))
    torch.library.opcheck(add_rms_norm_fwd, (x, residual, weight, 1e-6))
    rstd = rms_norm_fwd(x, weight, 1e-6)[1].detach()
    dy, x, weight = torch.randn_like(x), x.detach(), weight.detach()  # the bwd has no grad
    torch.library.opcheck(rms_norm_bwd, (dy, x, weight, rstd, None))
    torch.library.opcheck(rms_norm_bwd, (dy, x, weight, rstd, dy))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(4096, 4096), (8192, 2048), (2, 4096, 2048), (1024, 8192), (2048, 5120), (3000, 2050)]
)
def test_large_on_gpu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, weight = _inputs(shape, dtype)
    residual = torch.randn_like(x).requires_grad_()
    y, h = add_rms_norm(x, residual, weight)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward([y, h], [dy, dh])
    x32, r32, w32 = _fp32(x, residual, weight)
    y32, h32 = add_rms_norm_reference(x32, r32, w32)
    torch.autograd.backward([y32, h32], [dy.float(), dh.float()])
    _close(y, y32, dtype)
    _close(x.grad, x32.grad, dtype)
    _close(residual.grad, r32.grad, dtype)
    _close(weight.grad, w32.grad, dtype, _rows(shape))

    x.grad = weight.grad = None
    y = rms_norm(x, weight)
    y.backward(dy)
    x32.grad = w32.grad = None
    y32 = rms_norm_reference(x32, w32)
    y32.backward(dy.float())
    _close(y, y32, dtype)
    _close(x.grad, x32.grad, dtype)
    _close(weight.grad, w32.grad, dtype, _rows(shape))
