"""The kernel benchmark's case table: each kernel's providers, inputs, shapes and what one call
moves (bytes) or computes (FLOPs). The harness (`kernel_harness.py`) runs them."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16  # of every input but labels and cos/sin
BF16, FP32, INT64 = 2, 4, 8
EPS = 1e-6
IGNORE = -100
CE_KWARGS = {"ignore_index": IGNORE, "label_smoothing": 0.0, "reduction": "mean"}

Shape = tuple[Any, ...]
Inputs = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs) of one call


class NotApplicable(Exception):
    """The provider has no counterpart for this case."""


@dataclass(frozen=True)
class Kernel:
    """How to build one kernel's inputs, its providers, and what one call moves or computes."""

    turbo: Callable[[], Callable[..., Any]]
    reference: Callable[[], Callable[..., Any]]
    make: Callable[[Shape, torch.device], Inputs]
    grad_args: tuple[int, ...]  # positions of the args that get gradients
    modes: tuple[str, ...]
    shapes: tuple[Shape, ...]
    quick: tuple[Shape, ...]
    liger: Callable[[ModuleType], Callable[..., Any]] | None = None
    traffic: Callable[[Shape, str], int] | None = None  # bytes, each tensor once each way
    flops: Callable[[Shape, str], float] | None = None
    label: Callable[[Shape], str] = lambda shape: str(list(shape))
    copy_targets: dict[str, float] = field(default_factory=dict)  # mode: min of copy BW
    liger_targets: dict[str, float] = field(default_factory=dict)  # mode: min speedup
    note: str = ""


# --- providers ------------------------------------------------------------------------------


def ours(module: str, name: str) -> Callable[[], Callable[..., Any]]:
    """A loader of `primus.turbo.kernels.<module>.<name>` (imported when the case runs)."""
    return lambda: getattr(importlib.import_module(f"primus.turbo.kernels.{module}"), name)


def liger_rope(ops: ModuleType) -> Callable[..., torch.Tensor]:
    """`apply_rope` on `LigerRopeFunction`, which rotates q [b, h, s, d] and k in place in
    [b, s, h, d] storage (rotate-half only); k is a 1-head dummy here."""

    def rope(
        x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, seq_dim: int, interleaved: bool
    ) -> torch.Tensor:
        if interleaved:
            raise NotApplicable("liger's RoPE is rotate-half only")
        order = (1 - seq_dim, 2, seq_dim, 3)  # [s, b, h, d] or [b, s, h, d] -> [b, h, s, d]
        q = x.permute(order)
        k = q.new_zeros(q.shape[0], 1, *q.shape[2:])
        out, _ = ops.LigerRopeFunction.apply(q, k, cos, sin, None, 1, 2 * cos.shape[-1])
        return out.permute(sorted(range(4), key=order.__getitem__))

    return rope


def liger_cross_entropy(ops: ModuleType) -> Callable[..., torch.Tensor]:
    def cross_entropy(
        logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int,
        label_smoothing: float, reduction: str,
    ) -> torch.Tensor:  # fmt: skip
        return ops.LigerCrossEntropyFunction.apply(
            logits, labels, None, ignore_index, 0.0, label_smoothing, reduction
        )[0]

    return cross_entropy


def liger_linear_cross_entropy(ops: ModuleType) -> Callable[..., torch.Tensor]:
    def linear_cross_entropy(
        hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, ignore_index: int,
        label_smoothing: float, reduction: str,
    ) -> torch.Tensor:  # fmt: skip
        return ops.LigerFusedLinearCrossEntropyFunction.apply(
            hidden, weight, labels, None, None, ignore_index, 0.0, label_smoothing, reduction
        )[0]

    return linear_cross_entropy


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What the turbo patch makes Megatron's core attention: SDPA, causal, grouped KV heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's unfused DotProductAttention: KV heads repeated, softmax(QK^T * scale + causal
    mask) V, all in the inputs' dtype (bf16)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    s = q.shape[-2]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.masked_fill(causal, -10000.0), dim=-1)
    return torch.matmul(probs, v)


# --- inputs ---------------------------------------------------------------------------------


def randn(*shape: int, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device) * scale).to(DTYPE)


def labels(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Targets in [0, vocab), about one in 16 set to the ignore index."""
    out = torch.randint(0, vocab, (n,), device=device)
    return out.masked_fill(torch.rand(n, device=device) < 1 / 16, IGNORE)


def rms_norm_inputs(shape: Shape, device: torch.device) -> Inputs:
    m, n = shape
    return (randn(m, n, device=device), 1 + randn(n, device=device, scale=0.1), EPS), {}


def add_rms_norm_inputs(shape: Shape, device: torch.device) -> Inputs:
    (x, weight, eps), _ = rms_norm_inputs(shape, device)
    return (x, randn(*shape, device=device), weight, eps), {}


def swiglu_inputs(shape: Shape, device: torch.device) -> Inputs:
    return (randn(*shape, device=device), randn(*shape, device=device)), {}


def packed_inputs(shape: Shape, device: torch.device) -> Inputs:
    return (randn(*shape, device=device),), {}


def rope_inputs(shape: Shape, device: torch.device) -> Inputs:
    """shape: (layout "sbhd"/"bshd", dims in that order, interleaved); cos/sin [s, d/2] fp32."""
    layout, dims, interleaved = shape
    s, d = dims[layout.index("s")], dims[-1]
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv_freq)
    x = randn(*dims, device=device)
    return (x, angles.cos(), angles.sin()), {
        "seq_dim": layout.index("s"),
        "interleaved": interleaved,
    }


def cross_entropy_inputs(shape: Shape, device: torch.device) -> Inputs:
    n, vocab = shape
    return (randn(n, vocab, device=device), labels(n, vocab, device)), dict(CE_KWARGS)


def linear_cross_entropy_inputs(shape: Shape, device: torch.device) -> Inputs:
    n, hidden, vocab = shape
    h, w = randn(n, hidden, device=device), randn(vocab, hidden, device=device, scale=hidden**-0.5)
    return (h, w, labels(n, vocab, device)), dict(CE_KWARGS)


def attention_inputs(shape: Shape, device: torch.device) -> Inputs:
    b, heads, kv_heads, s, d = shape
    q = randn(b, heads, s, d, device=device)
    return (q, randn(b, kv_heads, s, d, device=device), randn(b, kv_heads, s, d, device=device)), {}


# --- bytes and FLOPs per call ---------------------------------------------------------------


def rms_norm_traffic(shape: Shape, mode: str) -> int:
    """fwd: read x, w; write y. bwd: read x, dy, w, rstd; write dx, dw."""
    m, n = shape
    if mode == "fwd":
        return 2 * m * n * BF16 + n * BF16
    return 3 * m * n * BF16 + 2 * n * BF16 + m * FP32


def add_rms_norm_traffic(shape: Shape, mode: str) -> int:
    """fwd: read x, residual, w; write y, h. bwd: read h, dy, dh, w, rstd; write dx (the grad
    of x and of residual alike), dw."""
    m, n = shape
    if mode == "fwd":
        return 4 * m * n * BF16 + n * BF16
    return 4 * m * n * BF16 + 2 * n * BF16 + m * FP32


def glu_traffic(elements: int, mode: str) -> int:
    """fwd: read gate, up; write out. bwd: read gate, up, dout; write dgate, dup."""
    return (3 if mode == "fwd" else 5) * elements * BF16


def rope_traffic(shape: Shape, mode: str) -> int:
    """fwd and bwd alike: read x (dy), cos, sin; write y (dx)."""
    layout, dims, _ = shape
    return 2 * math.prod(dims) * BF16 + 2 * dims[layout.index("s")] * (dims[-1] // 2) * FP32


def cross_entropy_traffic(shape: Shape, mode: str) -> int:
    """fwd: read logits, labels. fwd+bwd: read logits, labels; write dlogits."""
    n, vocab = shape
    return (1 if mode == "fwd" else 2) * n * vocab * BF16 + n * INT64


def linear_cross_entropy_flops(shape: Shape, mode: str) -> float:
    """Model FLOPs: logits 2NHV, then dhidden and dweight 2NHV each (recompute not counted)."""
    n, hidden, vocab = shape
    return 2.0 * n * hidden * vocab * (1 if mode == "fwd" else 3)


def attention_flops(shape: Shape, mode: str) -> float:
    """Causal: 4 b h s^2 d / 2 forward, 2.5 times that backward."""
    b, heads, _, s, d = shape
    return 4.0 * b * heads * s * s * d / 2 * (1 if mode == "fwd" else 2.5)


# --- the cases ------------------------------------------------------------------------------

KERNELS: dict[str, Kernel] = {
    "rms_norm": Kernel(
        turbo=ours("rms_norm", "rms_norm"),
        reference=ours("rms_norm", "rms_norm_reference"),
        make=rms_norm_inputs,
        grad_args=(0, 1),
        modes=("fwd", "bwd"),
        shapes=((4096, 2048), (4096, 4096), (8192, 2048), (16384, 8192)),
        quick=((64, 256), (33, 1000)),
        liger=lambda ops: (
            lambda x, w, eps: ops.LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
        ),
        traffic=rms_norm_traffic,
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="liger: LigerRMSNormFunction(x, w, eps, offset=0, casting_mode='llama', "
        "in_place=False). [4096, 2048] is Llama-3.2-1B's.",
    ),
    "add_rms_norm": Kernel(
        turbo=ours("rms_norm", "add_rms_norm"),
        reference=ours("rms_norm", "add_rms_norm_reference"),
        make=add_rms_norm_inputs,
        grad_args=(0, 1, 2),
        modes=("fwd", "bwd"),
        shapes=((4096, 2048), (4096, 4096), (16384, 8192)),
        quick=((64, 256),),
        liger=lambda ops: (
            lambda x, r, w, eps: ops.LigerFusedAddRMSNormFunction.apply(
                x, r, w, eps, 0.0, "llama", False
            )
        ),
        traffic=add_rms_norm_traffic,
        note="(y, h) = (rms_norm(x + residual), x + residual). liger: "
        "LigerFusedAddRMSNormFunction(x, residual, w, eps, 0, 'llama', in_place=False).",
    ),
    "swiglu": Kernel(
        turbo=ours("swiglu", "swiglu"),
        reference=ours("swiglu", "swiglu_reference"),
        make=swiglu_inputs,
        grad_args=(0, 1),
        modes=("fwd", "bwd"),
        shapes=((4096, 8192), (8192, 8192)),
        quick=((64, 256),),
        liger=lambda ops: ops.LigerSiLUMulFunction.apply,
        traffic=lambda shape, mode: glu_traffic(math.prod(shape), mode),
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="silu(gate) * up, shape = gate's = up's; [4096, 8192] is Llama-3.2-1B's. "
        "liger: LigerSiLUMulFunction(gate, up) (its backward writes the grads into gate and up).",
    ),
    "swiglu_packed": Kernel(
        turbo=ours("swiglu", "swiglu_packed"),
        reference=ours("swiglu", "swiglu_packed_reference"),
        make=packed_inputs,
        grad_args=(0,),
        modes=("fwd", "bwd"),
        shapes=((4096, 16384), (8192, 16384)),
        quick=((64, 512),),
        liger=lambda ops: lambda x: ops.LigerFusedGateUpSiLUMulFunction.apply(x, False),
        traffic=lambda shape, mode: glu_traffic(math.prod(shape) // 2, mode),
        copy_targets={"fwd": 0.85, "bwd": 0.70},
        note="x = [gate | up] on the last dim (Megatron's linear_fc1 output), shape = x's. "
        "liger: LigerFusedGateUpSiLUMulFunction(x, in_place=False).",
    ),
    "rope": Kernel(
        turbo=ours("rope", "apply_rope"),
        reference=ours("rope", "apply_rope_reference"),
        make=rope_inputs,
        grad_args=(0,),
        modes=("fwd", "bwd"),
        shapes=(
            ("sbhd", (4096, 1, 32, 64), False),
            ("bshd", (2, 4096, 32, 128), False),
            ("sbhd", (4096, 1, 32, 64), True),
        ),
        quick=(
            ("sbhd", (16, 1, 4, 32), False),
            ("sbhd", (16, 2, 4, 32), False),
            ("bshd", (2, 16, 4, 64), False),
            ("bshd", (2, 16, 4, 32), True),
        ),
        liger=liger_rope,
        traffic=rope_traffic,
        label=lambda shape: f"{shape[0]} {list(shape[1])}" + (" interleaved" if shape[2] else ""),
        note="x [s, b, h, d] (Megatron) or [b, s, h, d] (TorchTitan), cos/sin [s, d/2] fp32. "
        "liger: LigerRopeFunction(q, k, cos, sin, None, 1, rotary_dim=d) on q = x viewed as "
        "[b, h, s, d] (no copy for bshd, nor for sbhd with b = 1) and a 1-head dummy k "
        "(+1/h of its traffic); it rotates in place; interleaved: n/a.",
    ),
    "cross_entropy": Kernel(
        turbo=ours("cross_entropy", "cross_entropy"),
        reference=ours("cross_entropy", "cross_entropy_reference"),
        make=cross_entropy_inputs,
        grad_args=(0,),
        modes=("fwd", "fwd+bwd"),
        shapes=((4096, 128256), (8192, 128256)),
        quick=((32, 1000), (16, 5000)),
        liger=liger_cross_entropy,
        traffic=cross_entropy_traffic,
        liger_targets={"fwd+bwd": 2.0},
        note="logits [N, V] bf16, mean over labels, 1/16 ignored. liger: "
        "LigerCrossEntropyFunction (writes the logits' grad into the logits during forward).",
    ),
    "linear_cross_entropy": Kernel(
        turbo=ours("linear_cross_entropy", "linear_cross_entropy"),
        reference=ours("linear_cross_entropy", "linear_cross_entropy_reference"),
        make=linear_cross_entropy_inputs,
        grad_args=(0, 1),
        modes=("fwd+bwd",),
        shapes=((4096, 2048, 128256), (8192, 2048, 128256)),
        quick=((32, 64, 1000),),
        liger=liger_linear_cross_entropy,
        flops=linear_cross_entropy_flops,
        label=lambda shape: "[N={}, H={}, V={}]".format(*shape),
        note="loss of hidden [N, H] @ weight[V, H]^T; eager = matmul + cross-entropy. liger: "
        "LigerFusedLinearCrossEntropyFunction (grads computed in forward, grad_weight "
        "accumulated in bf16: accum_dtype=None, its default).",
    ),
    "attention": Kernel(
        turbo=lambda: sdpa_attention,
        reference=lambda: attention_reference,
        make=attention_inputs,
        grad_args=(0, 1, 2),
        modes=("fwd", "bwd"),
        shapes=((1, 32, 8, 4096, 64),),
        quick=((1, 4, 2, 64, 32),),
        flops=attention_flops,
        label=lambda shape: "[b={}, h={}, kv_heads={}, s={}, d={}]".format(*shape),
        note="turbo = torch SDPA(is_causal, enable_gqa), what the turbo patch makes Megatron's "
        "core attention; eager = Megatron's unfused DotProductAttention in bf16.",
    ),
}
