"""Chunked linear + cross-entropy against the full logits in fp32, on fp32 copies of the inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from primus.turbo.kernels import linear_cross_entropy as lce_module
from primus.turbo.kernels.linear_cross_entropy import (
    linear_cross_entropy,
    linear_cross_entropy_reference,
)

# Unlike the reference, the chunk's logits are rounded to the inputs' dtype, and so are the
# logits' gradient and grad_hidden; grad_weight sums in fp32. Tolerances are relative to the
# largest reference value (absolute) and elementwise (relative).
TOL = {
    torch.float32: {"loss": 1e-5, "grad": 1e-5},
    torch.float16: {"loss": 1e-3, "grad": 5e-3},
    torch.bfloat16: {"loss": 1e-2, "grad": 2e-2},
}
DTYPES = list(TOL)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IGNORE = -100


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.float(), expected, atol=tol * scale, rtol=tol)


def _inputs(
    shape: tuple[int, ...], vocab: int, dtype: torch.dtype, ignored: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [*shape], weight [vocab, H] scaled to logits of std ~2, labels (first `ignored`
    are IGNORE)."""
    gen = torch.Generator(DEVICE).manual_seed(0)
    hidden = torch.randn(shape, generator=gen, device=DEVICE).to(dtype)
    weight = torch.randn(vocab, shape[-1], generator=gen, device=DEVICE) * 2 / shape[-1] ** 0.5
    labels = torch.randint(0, vocab, shape[:-1], generator=gen, device=DEVICE)
    labels.view(-1)[:ignored] = IGNORE
    return hidden, weight.to(dtype), labels


def _run(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    fn: Callable[..., torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_hidden, grad_weight) with an upstream gradient of 2."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = fn(h, w, labels, **kwargs)
    loss.backward(torch.tensor(2.0, device=DEVICE))
    return loss.detach(), h.grad, w.grad


def _check(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> None:
    tol = TOL[hidden.dtype]
    loss, grad_h, grad_w = _run(hidden, weight, labels, linear_cross_entropy, **kwargs)
    kwargs.pop("chunk_size", None)
    ref = _run(hidden.float(), weight.float(), labels, linear_cross_entropy_reference, **kwargs)
    assert loss.dtype == torch.float32
    assert grad_h.dtype == grad_w.dtype == hidden.dtype
    _close(loss, ref[0], tol["loss"])
    _close(grad_h, ref[1], tol["grad"])
    _close(grad_w, ref[2], tol["grad"])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype: torch.dtype, reduction: str, label_smoothing: float) -> None:
    """Chunks of 5 tokens over 14: the last chunk is partial."""
    hidden, weight, labels = _inputs((2, 7, 64), 1000, dtype)
    _check(
        hidden, weight, labels, reduction=reduction, label_smoothing=label_smoothing, chunk_size=5
    )


def test_default_chunk() -> None:
    hidden, weight, labels = _inputs((7, 32), 4099, torch.bfloat16)
    _check(hidden, weight, labels, label_smoothing=0.1)


def test_one_input_needs_grad() -> None:
    """Only the input that requires grad gets one."""
    hidden, weight, labels = _inputs((9, 32), 1000, torch.float32)
    h = hidden.clone().requires_grad_()
    linear_cross_entropy(h, weight, labels, chunk_size=4).backward()
    w = weight.clone().requires_grad_()
    linear_cross_entropy(hidden, w, labels, chunk_size=4).backward()
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    linear_cross_entropy_reference(h_ref, w_ref, labels).backward()
    ref_h, ref_w = h_ref.grad, w_ref.grad
    _close(h.grad, ref_h, TOL[torch.float32]["grad"])
    _close(w.grad, ref_w, TOL[torch.float32]["grad"])


def test_no_grad() -> None:
    hidden, weight, labels = _inputs((9, 32), 1000, torch.bfloat16)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, labels, chunk_size=4)
    expected = linear_cross_entropy_reference(hidden.float(), weight.float(), labels)
    assert not loss.requires_grad
    _close(loss, expected.detach(), TOL[torch.bfloat16]["loss"])


def test_all_ignored() -> None:
    """Like torch: "mean" over no tokens is nan, "sum" is 0, and the gradients are 0."""
    hidden, weight, labels = _inputs((6, 32), 1000, torch.bfloat16, ignored=6)
    for reduction, expected in (("mean", float("nan")), ("sum", 0.0)):
        loss, grad_h, grad_w = _run(
            hidden, weight, labels, linear_cross_entropy, reduction=reduction, chunk_size=4
        )
        torch.testing.assert_close(loss, torch.tensor(expected, device=DEVICE), equal_nan=True)
        assert torch.count_nonzero(grad_h) == torch.count_nonzero(grad_w) == 0


def test_compile_fullgraph() -> None:
    hidden, weight, labels = _inputs((2, 5, 32), 1000, torch.float32)

    def loss_fn(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(h, w, y, label_smoothing=0.1, chunk_size=4)

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    for actual, expected in zip(
        _run(hidden, weight, labels, compiled),
        _run(hidden, weight, labels, loss_fn),
        strict=True,
    ):
        torch.testing.assert_close(actual, expected)


def test_reference_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    hidden, weight, labels = _inputs((5, 16), 300, torch.float32)
    monkeypatch.setattr(lce_module, "on_triton", lambda *tensors: False)
    expected = linear_cross_entropy_reference(hidden, weight, labels)
    assert torch.equal(linear_cross_entropy(hidden, weight, labels), expected)


@pytest.mark.parametrize(
    ("reduction", "label_smoothing", "chunk_size"),
    [("none", 0.0, None), ("average", 0.0, None), ("sum", 2.0, None), ("mean", 0.0, 0)],
)
def test_bad_arguments(reduction: str, label_smoothing: float, chunk_size: int | None) -> None:
    hidden, weight, labels = _inputs((4, 8), 10, torch.float32)
    with pytest.raises(ValueError):
        linear_cross_entropy(
            hidden,
            weight,
            labels,
            reduction=reduction,
            label_smoothing=label_smoothing,
            chunk_size=chunk_size,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [None, 1000])
def test_llama3_head_on_gpu(chunk_size: int | None) -> None:
    hidden, weight, labels = _inputs((4096, 2048), 128256, torch.bfloat16, ignored=512)
    _check(hidden, weight, labels, label_smoothing=0.1, chunk_size=chunk_size)
