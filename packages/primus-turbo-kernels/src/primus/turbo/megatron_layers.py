"""The replacements the megatron turbo patches install (imports megatron: load only from a
patch handler). Each keeps the upstream signature and hands the cases it does not cover back
to the upstream code, so turning a feature on never changes what a config means.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.fusions import fused_bias_swiglu
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer import torch_norm
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from primus.turbo.kernels.cross_entropy import cross_entropy
from primus.turbo.kernels.rms_norm import RMSNorm
from primus.turbo.kernels.rope import apply_rope, apply_rope_qkv
from primus.turbo.kernels.swiglu import swiglu_packed

UPSTREAM_NORM = torch_norm.WrappedTorchNorm
UPSTREAM_SWIGLU = fused_bias_swiglu.bias_swiglu_impl
UPSTREAM_ROPE = rope_utils.apply_rotary_pos_emb
UPSTREAM_LOSS = LanguageModule.compute_language_model_loss


class TurboWrappedNorm:
    """`WrappedTorchNorm` whose RMSNorm is the Triton kernel (same `weight`, same checks).

    Unlike the torch norm it splits under sequence parallelism: each tensor-parallel rank
    normalizes its slice of the sequence, and its weight is marked `sequence_parallel`, so
    Megatron sums the weight's gradient over the tensor-parallel group (as it does for
    Transformer Engine's and Apex's norms)."""

    sequence_parallel_normalizations = ("RMSNorm",)  # what Megatron's model-build check reads

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> Any:
        split = config.sequence_parallel and config.normalization == "RMSNorm"
        if split:  # upstream's other checks still apply; only its sequence-parallel one is lifted
            config = copy.copy(config)
            config.sequence_parallel = False
        norm = UPSTREAM_NORM(config, hidden_size, eps, **kwargs)
        if type(norm) is not torch.nn.RMSNorm:
            return norm
        weight = norm.weight
        turbo = RMSNorm(hidden_size, eps=eps, device=weight.device, dtype=weight.dtype)
        if split:
            turbo.weight.sequence_parallel = True  # type: ignore[attr-defined]  # Megatron reads it
        return turbo


def turbo_bias_swiglu(
    input: torch.Tensor,
    bias: torch.Tensor | None,
    fp8_input_store: bool = False,
    cpu_offload_input: bool = False,
) -> torch.Tensor:
    """`bias_swiglu_impl` on the Triton SwiGLU (the first half of fc1 is the gate); FP8 input
    storage and CPU offloading stay upstream."""
    if fp8_input_store or cpu_offload_input:
        return UPSTREAM_SWIGLU(input, bias, fp8_input_store, cpu_offload_input)
    return swiglu_packed(input if bias is None else input + bias)


_last_cos_sin: list[Any] = [None, None, None]  # freqs, (version, interleaved, mscale), (cos, sin)


def _cos_sin(freqs: torch.Tensor, interleaved: bool, mscale: float) -> tuple[torch.Tensor, ...]:
    """cos and sin [s, R/2] of Megatron's angles [s, 1, 1, R], kept for the next call with
    the same tensor: every layer's query and key share one `freqs` per forward."""
    key = (freqs._version, interleaved, mscale)
    if _last_cos_sin[0] is freqs and _last_cos_sin[1] == key:
        return _last_cos_sin[2]
    angles = freqs[:, 0, 0].float()
    # Megatron repeats each angle for the rotated pair: cat(f, f) or interleaved f0 f0 f1 f1.
    half = angles[:, 0::2] if interleaved else angles[:, : angles.shape[-1] // 2]
    cos, sin = torch.cos(half), torch.sin(half)
    if mscale != 1.0:
        cos, sin = cos * mscale, sin * mscale
    _last_cos_sin[:] = [freqs, key, (cos, sin)]
    return cos, sin


def turbo_apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    config: Any,
    cu_seqlens: torch.Tensor | None = None,
    mscale: float = 1.0,
    cp_group: Any = None,
    mla_rotary_interleaved: bool | None = False,
) -> torch.Tensor:
    """`apply_rotary_pos_emb` on the Triton kernel for [s, b, h, d] input; packed sequences,
    MLA interleaving, multi-section RoPE and TE's fusion stay upstream."""
    if mla_rotary_interleaved is None:  # upstream's meaning: follow the model
        mla_rotary_interleaved = config.multi_latent_attention
    if (
        cu_seqlens is not None
        or mla_rotary_interleaved
        or config.apply_rope_fusion
        or freqs.dim() != 4
        or freqs.shape[1] != 1
    ):
        return UPSTREAM_ROPE(t, freqs, config, cu_seqlens, mscale, cp_group, mla_rotary_interleaved)
    cos, sin = _cos_sin(freqs, config.rotary_interleaved, mscale)
    return apply_rope(t, cos, sin, seq_dim=0, interleaved=config.rotary_interleaved)


def turbo_fused_qkv_rope(
    mixed_qkv: torch.Tensor,
    q_freqs: torch.Tensor,
    k_freqs: torch.Tensor,
    split_arg_list: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Transformer Engine's `apply_fused_qkv_rotary_pos_emb`, which Megatron calls under
    `fused_single_qkv_rope`, on the Triton kernel: query and key of the unsplit QKV
    `[s, b, groups, (q + 2) * d]` rotated in one launch. Megatron passes it no mscale and no
    interleaving; the patch turns the path on only where neither applies."""
    if k_freqs is not q_freqs and not torch.equal(k_freqs, q_freqs):
        raise ValueError("the fused QKV RoPE needs one angle table for query and key")
    cos, sin = _cos_sin(q_freqs, False, 1.0)
    return apply_rope_qkv(mixed_qkv, cos, sin, head_dim=split_arg_list[1])


class TurboDotProductAttention(DotProductAttention):
    """Megatron's local core attention through PyTorch SDPA (flash or memory-efficient
    kernels, GQA without repeating K/V), causal or unmasked by the layer's mask type; attention
    biases, packed-sequence params, softmax offsets and windows stay upstream."""

    rows_bring_masks = False  # the rows' own masks are applied (TurboMaskedDotProductAttention)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        mask_type = attn_mask_type or self.attn_mask_type
        own_mask = attention_mask if self.rows_bring_masks else None
        if (
            (own_mask is None and mask_type not in (AttnMaskType.causal, AttnMaskType.no_mask))
            or (own_mask is not None and own_mask.dtype != torch.bool)
            or attention_bias is not None
            or packed_seq_params is not None
            or self.softmax_offset is not None
            or self.scale_mask_softmax.window_size is not None
        ):
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        scale = self.softmax_scale
        if self.config.apply_query_key_layer_scaling:  # upstream divides here, softmax multiplies
            scale *= self.layer_number
        # [s, b, heads, d] -> [b, heads, s, d] (views; SDPA takes the strides)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        dropout = self.attention_dropout.p if self.training else 0.0
        if own_mask is not None and dropout == 0.0 and flex_runs_on(q.device):
            context = masked_flex_attention(q, k, v, own_mask, scale)
        else:
            groups = q.shape[1] // k.shape[1]
            if own_mask is not None and groups > 1:  # SDPA's masked kernels take no GQA
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            with tensor_parallel.get_cuda_rng_tracker().fork():
                context = F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    # Megatron's mask is True where masked, SDPA's where attended
                    attn_mask=None if own_mask is None else ~own_mask,
                    dropout_p=dropout,
                    is_causal=own_mask is None and mask_type == AttnMaskType.causal,
                    scale=scale,
                    enable_gqa=q.shape[1] != k.shape[1],
                )
        # [b, heads, s, d] -> [s, b, heads * d]
        context = context.permute(2, 0, 1, 3).contiguous()
        return context.view(*context.shape[:2], self.hidden_size_per_partition)


class TurboMaskedDotProductAttention(TurboDotProductAttention):
    """Attention under the mask each row brings (packed documents' block-diagonal causal
    mask): FlexAttention on a GPU, which skips the tiles the mask covers whole; SDPA with the
    mask elsewhere and with dropout."""

    rows_bring_masks = True


@functools.cache
def flex_runs_on(device: torch.device) -> bool:
    """Whether FlexAttention's Triton kernels run on `device`: a GPU of compute capability 8.0
    or newer (an NVIDIA one; ROCm's report 9.x), with a torch that has them (2.5 and newer)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):
        return False
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


_last_block_mask: list[Any] = [None, None, None]  # mask, its version, its BlockMask


@functools.cache
def _compiled_flex() -> tuple[Any, Any]:
    """flex_attention and create_block_mask compiled, once a process."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention), torch.compile(create_block_mask)


def masked_flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """FlexAttention of [b, heads, s, d] q, k, v under Megatron's bool mask [b, 1, s, s] (True
    where masked; every position sees at least itself), GQA included. The block mask (which
    128 x 128 tiles have anything to attend) is made once per mask tensor: the layers of a
    forward share it."""
    flex, make_block_mask = _compiled_flex()
    if _last_block_mask[0] is not mask or _last_block_mask[1] != mask._version:
        attended = (~mask[:, 0]).expand(q.shape[0], -1, -1)  # a mask of one row serves all

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return attended[b, q_idx, kv_idx]

        rows, length, kv_length = attended.shape
        block_mask = make_block_mask(mask_mod, rows, None, length, kv_length, device=mask.device)
        _last_block_mask[:] = [mask, mask._version, block_mask]
    return flex(
        q, k, v, block_mask=_last_block_mask[2], scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def turbo_language_model_loss(
    self: LanguageModule, labels: torch.Tensor, logits: torch.Tensor
) -> torch.Tensor:
    """Per-token loss [b, s] from logits [s, b, V] without an fp32 copy of the logits; tensor
    parallel logits (vocab split across ranks) and TE's fused loss stay upstream."""
    if self.config.cross_entropy_loss_fusion or self.pg_collection.tp.size() > 1:
        return UPSTREAM_LOSS(self, labels, logits)
    loss = cross_entropy(logits, labels.transpose(0, 1), reduction="none", inplace_grad=True)
    return loss.transpose(0, 1).contiguous()


def foreach_l2_norm(
    chunk_size: int,
    noop_flag: Any,
    tensor_lists: list[list[torch.Tensor]],
    per_tensor: bool,
    *_: Any,
) -> tuple[torch.Tensor, None]:
    """`local_multi_tensor_l2_norm` without a host sync per tensor: one foreach norm."""
    tensors = [t for tensors in tensor_lists for t in tensors]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device="cuda"), None
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def foreach_scale(
    chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]], scale: float
) -> None:
    """`local_multi_tensor_scale` (dst = src * scale) as two foreach ops instead of a loop."""
    torch._foreach_copy_(tensor_lists[1], torch._foreach_mul(tensor_lists[0], scale))


class WgradAccumulation:
    """Apex's `fused_weight_gradient_mlp_cuda` in PyTorch: the weight-gradient GEMM adds into
    `main_grad` (fp32 output from bf16/fp16 inputs through cuBLAS), no separate bf16 grad + add."""

    @staticmethod
    def wgrad_gemm_accum_fp32(
        total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
    ) -> None:
        if main_grad.is_cuda:
            torch.addmm(main_grad, grad_output.t(), total_input, torch.float32, out=main_grad)
        else:  # CPU has no mixed-dtype GEMM
            main_grad.addmm_(grad_output.t().float(), total_input.float())

    @staticmethod
    def wgrad_gemm_accum_fp16(
        total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
    ) -> None:
        main_grad.addmm_(grad_output.t(), total_input)


def fused_adam(params: Any, *, adam_w_mode: bool = True, **kwargs: Any) -> torch.optim.Optimizer:
    """Megatron's fused-Adam constructor (Apex/TE signature) on PyTorch's fused Adam/AdamW."""
    adam = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return adam(params, fused=True, **kwargs)
