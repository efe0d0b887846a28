"""Turbo kernels in Megatron's local (non-Transformer-Engine) layers.

Each patch replaces one upstream name (or sets one param) through the engine (`ctx.replace`:
every module of megatron that imported it too), at `build_args`, before `pretrain()` builds the
model; the norm and CUDA graphs at `setup`, so Megatron's argument checks see them, and FP8 at
`setup`, so a run without FP8 hardware is refused before anything is built. The replacements
live in primus.turbo.megatron_layers and primus.turbo.megatron_fp8.
"""

from __future__ import annotations

from functools import partial

from primus.core.devices import wants_cpu
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, get_args, get_param
from primus.turbo.fp8 import FP8, PARAMS, fp8_recipe
from primus.turbo.switches import register_switches, turbo_patch

FEATURES = {
    "rms_norm": "Triton RMSNorm in every norm of the local spec",
    "swiglu": "Triton SwiGLU in the MLP",
    "rope": "Triton rotary embedding",
    "qkv_rope": "query and key rotated in one launch on the unsplit QKV projection",
    "attention": "PyTorch SDPA flash/efficient attention as the core attention",
    "cross_entropy": "Triton cross-entropy for the language-model loss",
    "optimizer": "fused Adam and foreach grad-norm/scale instead of the Python fallbacks",
    "grad_accum_fusion": "weight-gradient GEMMs accumulate into the fp32 main grads",
    "cuda_graphs": "each iteration's forward and backward replayed as one CUDA graph",
}
register_switches("megatron", FEATURES, opt_in=FP8, params=PARAMS)
_turbo = partial(turbo_patch, "megatron", backend_versions=TESTED)


def _installed(feature: str, sites: list[str]) -> None:
    log_rank_0(f"[turbo] {feature}: {', '.join(sites) or 'already installed'}")


def _kept_upstream(feature: str, why: str) -> str:
    """Log and return why `feature` keeps the upstream code (the report shows it skipped)."""
    log_rank_0(f"[turbo] {feature}: upstream kept: {why}")
    return why


@_turbo("rms_norm", "megatron.core.transformer.torch_norm.WrappedTorchNorm", phase="setup")
def turbo_rms_norm(ctx: PatchContext) -> None:
    """RMSNorm layers of the local spec run the Triton kernel (LayerNorm stays PyTorch's), also
    under sequence parallelism. At `setup`, so Megatron's args check sees the norm it gets."""
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401  (imports every user)

    from primus.turbo import megatron_layers as layers

    torch_norm = "megatron.core.transformer.torch_norm"
    _installed("rms_norm", ctx.replace(torch_norm, "WrappedTorchNorm", layers.TurboWrappedNorm))


@_turbo("swiglu", "megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl")
def turbo_swiglu(ctx: PatchContext) -> None:
    """The MLP's SwiGLU runs the Triton kernel (turns on Megatron's bias_swiglu_fusion path)."""
    import megatron.core.transformer.mlp  # noqa: F401

    from primus.turbo import megatron_layers as layers

    args = get_args(ctx)
    if args.swiglu and not args.bias_swiglu_fusion:
        log_rank_0("[turbo] swiglu: bias_swiglu_fusion false -> true (the path turbo replaces)")
        args.bias_swiglu_fusion = True
    swiglu = "megatron.core.fusions.fused_bias_swiglu"
    sites = ctx.replace(swiglu, "bias_swiglu_impl", layers.turbo_bias_swiglu)
    _installed("swiglu", sites)


@_turbo("rope", "megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb")
def turbo_rope(ctx: PatchContext) -> None:
    """Rotary embedding of queries and keys runs the Triton kernel."""
    import megatron.core.transformer.attention  # noqa: F401

    from primus.turbo import megatron_layers as layers

    rope_utils = "megatron.core.models.common.embeddings.rope_utils"
    sites = ctx.replace(rope_utils, "apply_rotary_pos_emb", layers.turbo_apply_rotary_pos_emb)
    _installed("rope", sites)


@_turbo("qkv_rope", "megatron.core.transformer.attention.apply_fused_qkv_rotary_pos_emb")
def turbo_qkv_rope(ctx: PatchContext) -> str | None:
    """Query and key rotated in one launch on the unsplit QKV projection: Megatron's
    `fused_single_qkv_rope` path, whose kernel is otherwise Transformer Engine's."""
    import megatron.core.transformer.attention as attention

    from primus.turbo import megatron_layers as layers

    apart = _rotated_apart(ctx)
    if apart:
        return _kept_upstream("qkv_rope", f"query and key rotated apart: {apart}")
    get_args(ctx).fused_single_qkv_rope = True  # no CLI flag: Megatron's config copies args
    sites = ctx.replace(attention, "HAVE_FUSED_QKV_ROPE", True)
    fused = layers.turbo_fused_qkv_rope
    sites += ctx.replace(attention, "apply_fused_qkv_rotary_pos_emb", fused)
    _installed("qkv_rope", sites)
    return None


def _rotated_apart(ctx: PatchContext) -> str | None:
    """Why query and key cannot be rotated in one launch (None: they can)."""
    import megatron.core.transformer.attention as attention

    args = get_args(ctx)
    groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    reasons = {
        "Transformer Engine's fused QKV RoPE is installed": ctx.original(
            attention, "HAVE_FUSED_QKV_ROPE"
        ),
        f"{ctx.stage} packs sequences": ctx.stage != "pretrain",
        f"position_embedding_type is {args.position_embedding_type}": (
            args.position_embedding_type != "rope"
        ),
        "rotary_interleaved": args.rotary_interleaved,
        "QK norm": args.qk_layernorm or args.qk_l2_norm,
        "multi-latent attention": args.multi_latent_attention,
        "attention_output_gate": args.attention_output_gate,
        "fewer query groups than tensor-parallel ranks": (groups < args.tensor_model_parallel_size),
        "apply_rope_fusion (Transformer Engine's kernel)": args.apply_rope_fusion,
    }
    return next((why for why, applies in reasons.items() if applies), None)


@_turbo("attention", "megatron.core.transformer.dot_product_attention.DotProductAttention")
def turbo_attention(ctx: PatchContext) -> None:
    """Core attention of the local spec runs PyTorch SDPA (flash / memory-efficient, GQA).
    Rows that bring their own attention mask (packed fine-tuning's block-diagonal one,
    `reset_attention_mask`'s) are attended under it: FlexAttention on a GPU, SDPA elsewhere."""
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401

    from primus.turbo import megatron_layers as layers

    args = get_args(ctx)
    own = ctx.stage != "pretrain" or args.reset_attention_mask
    masked = args.create_attention_mask_in_dataloader and own
    attention = "megatron.core.transformer.dot_product_attention"
    turbo = layers.TurboMaskedDotProductAttention if masked else layers.TurboDotProductAttention
    sites = ctx.replace(attention, "DotProductAttention", turbo)
    _installed("attention (the rows' own masks)" if masked else "attention", sites)


@_turbo(
    "cross_entropy",
    "megatron.core.models.common.language_module.language_module.LanguageModule.compute_language_model_loss",
)
def turbo_cross_entropy(ctx: PatchContext) -> str | None:
    """The language-model loss runs the Triton cross-entropy (no fp32 copy of the logits)."""
    from megatron.core.models.common.language_module.language_module import LanguageModule

    from primus.turbo import megatron_layers as layers

    if get_args(ctx).tensor_model_parallel_size > 1:
        return _kept_upstream(
            "cross_entropy", "tensor parallel splits the logits: vocab-parallel loss"
        )
    sites = ctx.replace(
        LanguageModule, "compute_language_model_loss", layers.turbo_language_model_loss
    )
    _installed("cross_entropy", sites)
    return None


@_turbo("optimizer", "megatron.core.optimizer.Adam, megatron.core.utils.local_multi_tensor_*")
def turbo_optimizer(ctx: PatchContext) -> str | None:
    """PyTorch's fused Adam and foreach grad-norm/scale replace the Python fallbacks Megatron
    uses without Apex or Transformer Engine."""
    import megatron.core.optimizer as optimizer
    import megatron.core.optimizer.clip_grads  # noqa: F401
    from megatron.core import utils

    from primus.turbo import megatron_layers as layers

    if not ctx.original(optimizer, "USING_PYTORCH_OPTIMIZER"):
        return _kept_upstream("optimizer", "Apex or Transformer Engine provides the fused Adam")
    sites = ctx.replace(utils, "local_multi_tensor_l2_norm", layers.foreach_l2_norm)
    sites += ctx.replace(utils, "local_multi_tensor_scale", layers.foreach_scale)
    if get_args(ctx).use_precision_aware_optimizer:
        log_rank_0(
            "[turbo] optimizer: precision-aware optimizer needs TE's FusedAdam; Adam unchanged"
        )
    else:
        sites += ctx.replace(optimizer, "Adam", layers.fused_adam)
        sites += ctx.replace(optimizer, "USING_PYTORCH_OPTIMIZER", False)
    _installed("optimizer", sites)
    return None


@_turbo("grad_accum_fusion", "megatron.core.tensor_parallel.layers.fused_weight_gradient_mlp_cuda")
def turbo_grad_accum_fusion(ctx: PatchContext) -> str | None:
    """Weight-gradient GEMMs accumulate straight into the fp32 main grads (what Apex's
    gradient-accumulation fusion does), instead of a bf16 grad and a separate fp32 add."""
    from primus.turbo import megatron_layers as layers

    args = get_args(ctx)
    if getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False):
        return _kept_upstream("grad_accum_fusion", "FSDP keeps its own gradient path")
    tp_layers = "megatron.core.tensor_parallel.layers"
    sites = ctx.replace(tp_layers, "fused_weight_gradient_mlp_cuda", layers.WgradAccumulation)
    sites += ctx.replace(tp_layers, "_grad_accum_fusion_available", True)
    args.gradient_accumulation_fusion = True
    _installed("grad_accum_fusion", sites)
    return None


@_turbo(
    "fp8",
    "megatron.core.tensor_parallel.layers.linear_with_grad_accumulation_and_async_allreduce",
    phase="setup",
)
def turbo_fp8(ctx: PatchContext) -> None:
    """The linear layers of every transformer layer but the first and last run their GEMMs in
    FP8 (`turbo.fp8_recipe`); refused (exit 2) where the hardware has no FP8."""
    recipe = fp8_recipe(ctx)
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from primus.turbo import megatron_fp8

    tp_layers = "megatron.core.tensor_parallel.layers"
    name = "linear_with_grad_accumulation_and_async_allreduce"
    sites = ctx.replace(tp_layers, name, megatron_fp8.turbo_linear)
    sites += ctx.wrap(
        TransformerLayer, "__init__", lambda init: megatron_fp8.tag_linears(init, recipe)
    )
    _installed(f"fp8 ({recipe})", sites)


@_turbo("cuda_graphs", "megatron args: cuda_graph_impl", phase="setup")
def turbo_cuda_graphs(ctx: PatchContext) -> str | None:
    """Megatron's full-iteration CUDA graph: each training iteration's forward and backward
    (every micro-batch, the gradient reduction) replay one captured graph, so kernel launches
    no longer bound small micro-batches. The optimizer step and Primus's non-finite check run
    outside it. Needs the same shapes every iteration, which pretraining and fine-tuning have
    (fine-tuning rows are `seq_length` long, packed or padded, with a mask of the same shape;
    DPO's pairs too, the reference's forward, or its precomputed log-probabilities, inside
    the graph)."""
    if wants_cpu(ctx):
        return _kept_upstream("cuda_graphs", "CUDA graphs need a GPU")
    chosen = get_param(ctx, "cuda_graph_impl", "none")
    if chosen != "none":
        return _kept_upstream("cuda_graphs", f"cuda_graph_impl is {chosen}")
    ctx.set_param("cuda_graph_impl", "full_iteration", "turbo.cuda_graphs: one graph per iteration")
    return None
