"""RoPE kernel against its reference, Megatron's and TorchTitan's own rope, and torch.compile."""

from __future__ import annotations

import pytest
import torch

from primus.turbo.kernels import rope
from primus.turbo.kernels.rope import (
    apply_rope,
    apply_rope_qkv,
    apply_rope_reference,
    llama3_inv_freq,
    rope_cos_sin,
)

# Output vs the fp32 reference: one rounding to the output dtype (the interpreter truncates).
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
}
DTYPES = list(TOL)

# (shape of x, seq_dim): Megatron [s, b, h, d], TorchTitan [b, s, h, d], packed [t, h, d].
LAYOUTS = {"sbhd": ((6, 2, 3), 0), "bshd": ((2, 6, 3), 1), "thd": ((6, 3), 0)}
# (head dim D, rotary dim R): full, partial, not powers of two.
DIMS = [(32, 32), (96, 96), (80, 64), (40, 16)]


def _cos_sin(seq: int, rot_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_cos_sin(seq, llama3_inv_freq(rot_dim, 10000.0, factor=1.0))


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize(("dim", "rot_dim"), DIMS, ids=[f"D{d}R{r}" for d, r in DIMS])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_reference(
    layout: str, dim: int, rot_dim: int, interleaved: bool, dtype: torch.dtype
) -> None:
    lead, seq_dim = LAYOUTS[layout]
    x = torch.randn(*lead, dim).to(dtype)
    cos, sin = _cos_sin(x.shape[seq_dim], rot_dim)
    out = apply_rope(x, cos, sin, seq_dim=seq_dim, interleaved=interleaved)
    ref = apply_rope_reference(x.float(), cos, sin, seq_dim=seq_dim, interleaved=interleaved)
    _check(out, ref, dtype)
    assert out.is_contiguous()
    assert torch.equal(out[..., rot_dim:], x[..., rot_dim:])


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_strided_inputs(interleaved: bool) -> None:
    """Views of a fused QKV, a transposed tensor, a strided head dim, complex cos/sin views."""
    s, b, h, d = 5, 2, 3, 48
    qkv = torch.randn(s, b, h, 3 * d)
    cis = torch.polar(torch.ones(s, d // 2), torch.rand(s, d // 2) * 6)
    cos, sin = cis.real, cis.imag
    assert cos.stride() == (d, 2)
    for x, seq_dim in [
        (qkv[..., d : 2 * d], 0),
        (qkv[..., :d].transpose(0, 1), 1),
        (torch.randn(b, h, s, d).transpose(1, 2), 1),
        (qkv[..., ::3], 0),
    ]:
        out = apply_rope(x, cos, sin, seq_dim=seq_dim, interleaved=interleaved)
        ref = apply_rope_reference(
            x, cos.contiguous(), sin.contiguous(), seq_dim=seq_dim, interleaved=interleaved
        )
        _check(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_grad(layout: str, interleaved: bool, dtype: torch.dtype) -> None:
    lead, seq_dim = LAYOUTS[layout]
    x = torch.randn(*lead, 80).to(dtype)
    grad = torch.randn(*lead, 80).to(dtype)
    cos, sin = _cos_sin(x.shape[seq_dim], 64)
    x1 = x.clone().requires_grad_()
    apply_rope(x1, cos, sin, seq_dim=seq_dim, interleaved=interleaved).backward(grad)
    x2 = x.float().requires_grad_()
    apply_rope_reference(x2, cos, sin, seq_dim=seq_dim, interleaved=interleaved).backward(
        grad.float()
    )
    _check(x1.grad, x2.grad, dtype)


def test_double_backward() -> None:
    """The backward is again the op, so it is differentiable: d(J^T v)/dv applied to w is J w."""
    x = torch.randn(4, 2, 2, 24, requires_grad=True)
    v = torch.randn(4, 2, 2, 24, requires_grad=True)
    w = torch.randn(4, 2, 2, 24)
    cos, sin = _cos_sin(4, 16)
    out = apply_rope(x, cos, sin, seq_dim=0, interleaved=True)
    (dx,) = torch.autograd.grad(out, x, v, create_graph=True)
    (dv,) = torch.autograd.grad(dx, v, w)
    _check(dv, apply_rope_reference(w, cos, sin, seq_dim=0, interleaved=True), torch.float32)


def test_megatron_bshd(monkeypatch: pytest.MonkeyPatch) -> None:
    """cos/sin from Megatron's freqs [s, 1, 1, R] reproduce `_apply_rotary_pos_emb_bshd`."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # get_emb moves inv_freq
    s, b, h, d = 12, 2, 3, 64
    for interleaved in (False, True):
        for percent, mscale in ((1.0, 1.0), (0.5, 0.7)):
            emb = RotaryEmbedding(
                kv_channels=d,
                rotary_percent=percent,
                rotary_interleaved=interleaved,
                rotary_base=500000,
                rope_scaling=True,
                use_cpu_initialization=True,
            )
            freqs = emb.get_emb(s)
            rot_dim = freqs.shape[-1]
            angles = freqs[:, 0, 0, 0::2] if interleaved else freqs[:, 0, 0, : rot_dim // 2]
            cos, sin = angles.cos() * mscale, angles.sin() * mscale
            for dtype in (torch.float32, torch.bfloat16):
                t = torch.randn(s, b, h, d).to(dtype)
                want = _apply_rotary_pos_emb_bshd(  # on fp32: Megatron rounds cos/sin to t's dtype
                    t.float(), freqs, rotary_interleaved=interleaved, mscale=mscale
                )
                got = apply_rope(t, cos, sin, seq_dim=0, interleaved=interleaved)
                _check(got, want, dtype)


def test_torchtitan_complex_rope() -> None:
    """Real and imaginary parts of TorchTitan's `freqs_cis` reproduce `ComplexRoPE`."""
    from torchtitan.models.common.rope import ComplexRoPE

    b, s, d = 2, 10, 48
    module = ComplexRoPE.Config(dim=d, max_seq_len=16, theta=500000.0, scaling="llama").build()
    cis = module.cache[:s]
    for dtype in (torch.float32, torch.bfloat16):
        q, k = torch.randn(b, s, 4, d).to(dtype), torch.randn(b, s, 2, d).to(dtype)
        want_q, want_k = module(q, k)
        _check(apply_rope(q, cis.real, cis.imag, seq_dim=1, interleaved=True), want_q, dtype)
        _check(apply_rope(k, cis.real, cis.imag, seq_dim=1, interleaved=True), want_k, dtype)


LLAMA3_SCALINGS = [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (16.0, 2.0, 8.0, 4096)]


@pytest.mark.parametrize("scaling", LLAMA3_SCALINGS, ids=str)
def test_llama3_inv_freq(scaling: tuple[float, float, float, int]) -> None:
    """Equal to Megatron's `_apply_scaling` and TorchTitan's llama-scaled `freqs_cis`."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from torchtitan.models.common.rope import ComplexRoPE

    factor, low, high, original = scaling
    dim, base, seq = 128, 500000, 64
    ours = llama3_inv_freq(dim, base, factor, low, high, original)
    wavelen = 2 * torch.pi / ours
    assert (wavelen < original / high).any() and (wavelen > original / low).any()

    emb = RotaryEmbedding(dim, 1.0, rotary_base=base, use_cpu_initialization=True)
    megatron = emb._apply_scaling(
        emb.inv_freq,
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
    assert torch.equal(ours, megatron)
    if scaling == LLAMA3_SCALINGS[0]:  # Megatron's defaults, through its constructor
        scaled = RotaryEmbedding(
            dim, 1.0, rotary_base=base, rope_scaling=True, use_cpu_initialization=True
        )
        assert torch.equal(ours, scaled.inv_freq)
        emb.inv_freq = ours
        assert all(map(torch.equal, rope_cos_sin(seq, ours), emb.get_cos_sin(seq)))

    titan = ComplexRoPE.Config(
        dim=dim,
        max_seq_len=seq,
        theta=float(base),
        scaling="llama",
        scaling_factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    ).build()
    cos, sin = rope_cos_sin(seq, ours)
    torch.testing.assert_close(cos, titan.cache.real, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, titan.cache.imag, atol=1e-6, rtol=0)


def test_rope_cos_sin_positions() -> None:
    inv_freq = llama3_inv_freq(16, 10000.0)
    cos, sin = rope_cos_sin(torch.tensor([3, 0, 7]), inv_freq)
    full_cos, full_sin = rope_cos_sin(8, inv_freq)
    assert torch.equal(cos, full_cos[[3, 0, 7]]) and torch.equal(sin, full_sin[[3, 0, 7]])


def test_custom_op() -> None:
    x = torch.randn(4, 2, 3, 24)
    cos, sin = _cos_sin(4, 16)
    torch.library.opcheck(torch.ops.primus_turbo.rope.default, (x, cos, sin, 0, True, False))


def test_torch_compile_fullgraph() -> None:
    x = torch.randn(2, 6, 3, 40, requires_grad=True)
    cos, sin = _cos_sin(6, 32)

    def f(t: torch.Tensor) -> torch.Tensor:
        return apply_rope(t * 2, cos, sin, seq_dim=1, interleaved=True).sum(dim=-1)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    grad, x.grad = x.grad, None
    f(x).sum().backward()
    torch.testing.assert_close(out, f(x))
    torch.testing.assert_close(grad, x.grad)


def test_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton does not run (CPU, no interpreter) the op is the reference."""
    monkeypatch.setattr(rope, "on_triton", lambda *tensors: False)
    x = torch.randn(4, 2, 3, 24, requires_grad=True)
    cos, sin = _cos_sin(4, 16)
    out = apply_rope(x, cos, sin, seq_dim=0)
    torch.testing.assert_close(out, apply_rope_reference(x, cos, sin, seq_dim=0))
    (grad,) = torch.autograd.grad(out, x, out)
    torch.testing.assert_close(grad, x)  # the rotation is orthogonal


@pytest.mark.parametrize(
    ("x", "cos"),
    [((4, 2, 3, 8), (4, 5)), ((4, 2, 3, 8), (3, 2)), ((4, 8), (4, 2)), ((4, 2, 3, 8), (4, 0))],
)
def test_bad_shapes(x: tuple[int, ...], cos: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        apply_rope(torch.randn(x), torch.randn(cos), torch.randn(cos), seq_dim=0)


def _split_then_rope(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, interleaved: bool
) -> tuple[torch.Tensor, ...]:
    """What Megatron does without the fused path: split the groups, then rope query and key."""
    s, b, groups, width = qkv.shape
    per_group = width // head_dim - 2
    q, k, v = torch.split(qkv, [per_group * head_dim, head_dim, head_dim], dim=3)
    q = q.reshape(s, b, groups * per_group, head_dim)
    rope = {"cos": cos, "sin": sin, "seq_dim": 0, "interleaved": interleaved}
    return apply_rope_reference(q, **rope), apply_rope_reference(k, **rope), v


# (groups, query heads per group, head dim, rotary dim)
QKV_SHAPES = [(2, 2, 32, 32), (1, 4, 40, 16), (3, 1, 16, 16), (4, 8, 64, 64)]


def _check_qkv(
    shape: tuple[int, ...], rot_dim: int, interleaved: bool, dtype: torch.dtype, device: str
) -> None:
    """`apply_rope_qkv` on QKV of `shape` (s, b, groups, query heads per group, head dim):
    outputs and the gradient of the QKV against split-then-rope in fp32."""
    s, b, groups, per_group, dim = shape
    qkv = torch.randn(s, b, groups, (per_group + 2) * dim, device=device).to(dtype)
    heads = (groups * per_group, groups, groups)
    grads = [torch.randn(s, b, n, dim, device=device).to(dtype) for n in heads]
    cos, sin = (t.to(device) for t in _cos_sin(s, rot_dim))
    fused_in = qkv.clone().requires_grad_()
    fused = apply_rope_qkv(fused_in, cos, sin, head_dim=dim, interleaved=interleaved)
    torch.autograd.backward(fused, grads)
    split_in = qkv.float().requires_grad_()
    split = _split_then_rope(split_in, cos, sin, dim, interleaved)
    torch.autograd.backward(split, [g.float() for g in grads])
    for got, want in zip(fused, split, strict=True):
        _check(got, want, dtype)
    assert torch.equal(fused[2], qkv.unflatten(-1, (per_group + 2, dim))[:, :, :, -1])
    _check(fused_in.grad, split_in.grad, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize(("groups", "per_group", "dim", "rot_dim"), QKV_SHAPES)
def test_qkv_in_one_launch_matches_split_then_rope(
    groups: int, per_group: int, dim: int, rot_dim: int, interleaved: bool, dtype: torch.dtype
) -> None:
    _check_qkv((5, 2, groups, per_group, dim), rot_dim, interleaved, dtype, "cpu")


def test_qkv_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton does not run (CPU, no interpreter) the QKV op is its PyTorch reference."""
    monkeypatch.setattr(rope, "on_triton", lambda *tensors: False)
    for interleaved in (False, True):
        _check_qkv((5, 2, 2, 3, 32), 16, interleaved, torch.float32, "cpu")


def test_qkv_op() -> None:
    x = torch.randn(4, 2, 2 * 4, 24)
    cos, sin = _cos_sin(4, 16)
    for inverse in (False, True):
        args = (x, cos, sin, 2, False, inverse)
        torch.library.opcheck(torch.ops.primus_turbo.rope_qkv.default, args)


@pytest.mark.parametrize(
    ("qkv", "head_dim"), [((4, 2, 2, 48), 32), ((4, 2, 2, 64), 32), ((4, 2, 96), 32)]
)
def test_qkv_bad_shapes(qkv: tuple[int, ...], head_dim: int) -> None:
    cos, sin = _cos_sin(4, 16)
    with pytest.raises(ValueError):
        apply_rope_qkv(torch.randn(qkv), cos, sin, head_dim=head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize(
    ("shape", "seq_dim", "rot_dim"),
    [((4096, 1, 32, 64), 0, 64), ((2, 4096, 32, 128), 1, 128), ((2048, 2, 40, 96), 0, 48)],
    ids=["megatron", "torchtitan", "partial"],
)
def test_gpu_large(
    shape: tuple[int, ...], seq_dim: int, rot_dim: int, interleaved: bool, dtype: torch.dtype
) -> None:
    x = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
    grad = torch.randn(shape, device="cuda").to(dtype)
    cos, sin = (t.cuda() for t in _cos_sin(shape[seq_dim], rot_dim))
    out = apply_rope(x, cos, sin, seq_dim=seq_dim, interleaved=interleaved)
    (dx,) = torch.autograd.grad(out, x, grad)
    xf = x.detach().float().requires_grad_()
    ref = apply_rope_reference(xf, cos, sin, seq_dim=seq_dim, interleaved=interleaved)
    (dx_ref,) = torch.autograd.grad(ref, xf, grad.float())
    _check(out, ref, dtype)
    _check(dx, dx_ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_gpu_qkv_large(interleaved: bool, dtype: torch.dtype) -> None:
    """Llama 3.2 1B's attention (8 groups of 4 query heads, head dim 64) at sequence 4096."""
    _check_qkv((4096, 2, 8, 4, 64), 64, interleaved, dtype, "cuda")
