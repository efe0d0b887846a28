"""Cross-entropy kernels against `F.cross_entropy` on fp32 copies of the same logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from primus.turbo.kernels import cross_entropy as ce_module
from primus.turbo.kernels.cross_entropy import cross_entropy, cross_entropy_reference

# The loss sees the same values as the reference (upcast in registers), so it is fp32-close for
# every dtype; the gradient is rounded once to the logits' dtype. Tolerances are relative to
# the largest reference value (absolute) and elementwise (relative).
TOL = {
    torch.float32: {"loss": 1e-5, "grad": 1e-5},
    torch.float16: {"loss": 1e-5, "grad": 2e-3},
    torch.bfloat16: {"loss": 1e-5, "grad": 1e-2},
}
DTYPES = list(TOL)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IGNORE = -100


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.float(), expected, atol=tol * scale, rtol=tol)


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, ignored: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with spread like a trained LM head; the first `ignored` labels are IGNORE."""
    gen = torch.Generator(DEVICE).manual_seed(0)
    logits = (3 * torch.randn(shape, generator=gen, device=DEVICE)).to(dtype)
    labels = torch.randint(0, shape[-1], shape[:-1], generator=gen, device=DEVICE)
    labels.view(-1)[:ignored] = IGNORE
    return logits, labels


def _upstream(loss: torch.Tensor) -> torch.Tensor:
    """A fixed upstream gradient in [0.5, 1.5), one a token for "none"."""
    gen = torch.Generator(DEVICE).manual_seed(1)
    return torch.rand(loss.shape, generator=gen, device=DEVICE) + 0.5


def _run(
    logits: torch.Tensor,
    labels: torch.Tensor,
    fn: Callable[..., torch.Tensor] = cross_entropy,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logits' gradient) with `_upstream`'s gradient."""
    x = logits.detach().clone().requires_grad_()
    loss = fn(x, labels, **kwargs)
    loss.backward(_upstream(loss))
    return loss.detach(), x.grad


def _check(logits: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> None:
    tol = TOL[logits.dtype]
    loss, grad = _run(logits, labels, **kwargs)
    kwargs.pop("inplace_grad", None)
    ref_loss, ref_grad = _run(logits.float(), labels, cross_entropy_reference, **kwargs)
    assert loss.dtype == torch.float32 and loss.shape == ref_loss.shape
    assert grad.dtype == logits.dtype
    _close(loss, ref_loss, tol["loss"])
    _close(grad, ref_grad, tol["grad"])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype: torch.dtype, reduction: str, label_smoothing: float) -> None:
    logits, labels = _inputs((2, 3, 1000), dtype)
    _check(logits, labels, reduction=reduction, label_smoothing=label_smoothing)


@pytest.mark.parametrize("vocab", [4099, 50257])
def test_vocab_spans_blocks(vocab: int) -> None:
    """Several forward blocks (16384) and backward blocks (4096), the last one partial."""
    logits, labels = _inputs((3, vocab), torch.bfloat16, ignored=1)
    _check(logits, labels, reduction="mean", label_smoothing=0.1)


@pytest.mark.parametrize("shape", [(1000,), (7, 1000), (2, 2, 3, 1000)])
def test_leading_shapes(shape: tuple[int, ...]) -> None:
    logits, labels = _inputs(shape, torch.float32, ignored=0)
    _check(logits, labels, reduction="none")


def test_strided_rows() -> None:
    """Rows of a wider buffer (a padded vocabulary sliced off) are read in place."""
    wide, labels = _inputs((7, 1100), torch.bfloat16)
    _check(wide[:, :1000], labels.clamp(max=999), reduction="sum", label_smoothing=0.1)


def test_masked_vocab_tail() -> None:
    """-inf logits (padding masked out of the vocabulary) fill a whole block without nan."""
    logits, labels = _inputs((3, 5000), torch.float32, ignored=0)
    logits[:, :4096] = float("-inf")
    labels = labels.clamp(min=4096)
    loss, grad = _run(logits, labels, reduction="none")
    ref_loss, ref_grad = _run(logits, labels, cross_entropy_reference, reduction="none")
    _close(loss, ref_loss, TOL[torch.float32]["loss"])
    _close(grad, ref_grad, TOL[torch.float32]["grad"])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_all_ignored(label_smoothing: float) -> None:
    """Like torch: "mean" over no tokens is nan, "sum" and "none" are 0, gradients are 0."""
    logits, labels = _inputs((4, 1000), torch.bfloat16, ignored=4)
    for reduction in ("mean", "sum", "none"):
        loss, grad = _run(logits, labels, reduction=reduction, label_smoothing=label_smoothing)
        ref_loss, _ = _run(
            logits.float(),
            labels,
            cross_entropy_reference,
            reduction=reduction,
            label_smoothing=label_smoothing,
        )
        torch.testing.assert_close(loss, ref_loss, equal_nan=True)
        assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inplace_grad(dtype: torch.dtype, reduction: str) -> None:
    """The gradient lands in the logits' storage, equal to the out-of-place one; the logits
    are untouched until the backward."""
    logits, labels = _inputs((2, 5, 4099), dtype)
    _check(logits, labels, reduction=reduction, label_smoothing=0.1, inplace_grad=True)
    _, expected = _run(logits, labels, reduction=reduction, label_smoothing=0.1)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, labels, reduction=reduction, label_smoothing=0.1, inplace_grad=True)
    assert torch.equal(x.detach(), logits)
    loss.backward(_upstream(loss))
    assert torch.equal(x.grad, expected)
    assert torch.equal(x.detach(), expected)


def test_inplace_grad_guards_other_saved_users() -> None:
    """An op that saved the logits for its backward sees the overwrite through autograd's
    version counter instead of silently reading the gradient."""
    logits, labels = _inputs((3, 1000), torch.float32)
    x = logits.clone().requires_grad_()
    y = x * 1.0
    # Created first, so its backward runs after the cross-entropy's.
    squares = (y * y).sum()
    loss = cross_entropy(y, labels, inplace_grad=True) + squares
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("inplace_grad", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_compile_fullgraph(reduction: str, inplace_grad: bool) -> None:
    logits, labels = _inputs((2, 3, 1000), torch.bfloat16)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy(
            x * 1.0, y, reduction=reduction, label_smoothing=0.1, inplace_grad=inplace_grad
        )

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    loss, grad = _run(logits, labels, compiled)
    ref_loss, ref_grad = _run(logits, labels, loss_fn)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)


def test_ops_registered() -> None:
    """Schemas, fake kernels and autograd registration (torch.library.opcheck)."""
    logits, labels = _inputs((5, 300), torch.bfloat16)
    ops = torch.ops.primus_turbo
    torch.library.opcheck(
        ops.cross_entropy_fwd, (logits.clone().requires_grad_(), labels, IGNORE, 0.1, False)
    )
    _, lse = ops.cross_entropy_fwd(logits, labels, IGNORE, 0.1, False)
    grad_loss = torch.rand(5, device=DEVICE)
    args = (labels, lse, grad_loss, IGNORE, 0.1)
    torch.library.opcheck(ops.cross_entropy_bwd, (logits, *args))
    torch.library.opcheck(ops.cross_entropy_bwd_, (logits.clone(), *args))


def test_reference_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    logits, labels = _inputs((4, 300), torch.bfloat16)
    monkeypatch.setattr(ce_module, "on_triton", lambda *tensors: False)
    expected = cross_entropy_reference(logits, labels, label_smoothing=0.1)
    assert torch.equal(cross_entropy(logits, labels, label_smoothing=0.1), expected)


@pytest.mark.parametrize(
    ("reduction", "label_smoothing"), [("average", 0.0), ("mean", -0.1), ("sum", 1.5)]
)
def test_bad_arguments(reduction: str, label_smoothing: float) -> None:
    logits, labels = _inputs((2, 10), torch.float32)
    with pytest.raises(ValueError):
        cross_entropy(logits, labels, reduction=reduction, label_smoothing=label_smoothing)


@pytest.mark.gpu
@pytest.mark.parametrize("inplace_grad", [False, True])
@pytest.mark.parametrize("rows", [4096, 8192])
def test_llama3_vocab_on_gpu(rows: int, inplace_grad: bool) -> None:
    logits, labels = _inputs((rows, 128256), torch.bfloat16, ignored=rows // 8)
    _check(logits, labels, reduction="mean", label_smoothing=0.1, inplace_grad=inplace_grad)
    _check(logits, labels, reduction="none", inplace_grad=inplace_grad)
