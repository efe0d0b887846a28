"""Megatron's jobs as the memory projection sees them (`primus.core.projection`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from primus.core.projection import Job, Model, check_recompute, data_parallel

if TYPE_CHECKING:
    from primus.backends.megatron.checkpoint.hf_mapping import Layout

# what the loss keeps per logit: Megatron's vocab-parallel cross-entropy an fp32 softmax and,
# in the backward, its bf16 gradient; turbo's cross-entropy the bf16 logits and their gradient
LOGIT_BYTES = {"upstream": 6, "turbo": 4}
# the host's milliseconds to launch one layer's forward and backward in eager mode: an H100
# profile of the 1B recipe with turbo (docs/benchmarks/e2e.md) idled 35% of a 777 ms step of
# 16 layers x 8 micro batches waiting for launches
HOST_MS_PER_LAYER = 6.6
# and with tensor parallelism, its four collectives a layer and their autograd functions: the
# 1B recipe at TP 2 on two H100s (megatron-sequence-parallel-h100x2) took 7.6 ms a layer
HOST_MS_PER_TP_LAYER = 1.0


def layout(args: Any) -> Layout:
    """The shapes of the model Megatron's args build (the vocabulary padded as Megatron pads
    it)."""
    from primus.backends.megatron.checkpoint.hf_mapping import Layout, padded_vocab_size

    return Layout.of(args, padded_vocab_size(args, "for the projection"))


def model(args: Any, shape: Layout) -> Model:
    """The model Megatron's args build, of `shape` (`layout(args)`)."""
    return Model(
        layers=shape.num_layers,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.groups,
        head_dim=shape.head_dim,
        ffn=shape.ffn,
        vocab=shape.padded_vocab,
        tied=shape.tied,
        gated=bool(args.swiglu),
        qkv_bias=shape.qkv_bias,
        qk_norm=shape.qk_norm,
        experts=shape.experts,
        experts_per_token=args.moe_router_topk if shape.experts else 0,
    )


def adapter_parameters(args: Any, shape: Layout) -> int:
    """The parameters of the LoRA adapters `peft:` adds (primus.backends.megatron.posttrain.lora)
    to a model of `shape`: A (rank x in) and B (out x rank) for each targeted HF projection of
    each layer."""
    from primus.backends.megatron.checkpoint.hf_mapping import params
    from primus.backends.megatron.posttrain.lora import FUSED, target

    peft = getattr(args, "primus_peft", None)
    if peft is None:
        return 0
    linears = {f"decoder.layers.{path}.weight" for path in FUSED.values()}
    per_layer = sum(
        peft.rank * (out + inp)
        for param in params(shape)
        if param.key in linears
        for name, (out, inp) in zip(param.hf, param.shapes, strict=True)
        if target(name) in peft.target_modules
    )
    return per_layer * shape.num_layers


def training_job(args: Any, gpus: int, applied: frozenset[str]) -> Job:
    """Megatron's memory: bf16/fp16 weights with fp32 main gradients and an fp32 master copy
    (fp32 training: neither copy), Adam's two moments (SGD's one), the distributed optimizer
    as ZeRO stage 1; with `peft:` (LoRA) only the adapters have gradients and optimizer
    state."""
    tp, pp, cp = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
    )
    half = bool(args.bf16 or args.fp16)
    moments = 8 if args.optimizer == "adam" else 4
    flash = args.transformer_impl == "transformer_engine" or "megatron.turbo_attention" in applied
    turbo_loss = "megatron.turbo_cross_entropy" in applied
    fused = {"megatron.turbo_rms_norm", "megatron.turbo_swiglu", "megatron.turbo_rope"}
    shape = layout(args)
    return Job(
        model=model(args, shape),
        micro_batch=args.micro_batch_size,
        seq_len=args.seq_length,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=args.expert_model_parallel_size,
        dp=data_parallel(gpus, tp, pp, cp),
        weight_bytes=2 if half else 4,
        grad_bytes=2 if getattr(args, "grad_reduce_in_bf16", False) else 4,
        optimizer_bytes=moments + (4 if half else 0),
        zero=1 if args.use_distributed_optimizer else 0,
        adapter_parameters=adapter_parameters(args, shape),
        activation_bytes=2 if half else 4,
        sequence_parallel=bool(args.sequence_parallel),
        flash_attention=flash,
        recompute=args.recompute_granularity or "none",
        logit_bytes=LOGIT_BYTES["turbo" if turbo_loss else "upstream"],
        global_batch=args.global_batch_size,
        fused_kernels=fused <= applied,
        cuda_graphs=getattr(args, "cuda_graph_impl", "none") != "none",
        graph_pool_copies=1.0
        if getattr(args, "cuda_graph_impl", "none") == "full_iteration"
        else 0,
        overlap_grad_reduce=bool(args.overlap_grad_reduce),
        host_ms_per_layer=HOST_MS_PER_LAYER + (HOST_MS_PER_TP_LAYER if tp > 1 else 0.0),
    )


def layout_overrides(job: Job) -> dict[str, Any]:
    """Megatron's keys for `job`'s layout."""
    check_recompute(job, "Megatron", ("none", "selective", "full"))
    return {
        "tensor_model_parallel_size": job.tp,
        "pipeline_model_parallel_size": job.pp,
        "context_parallel_size": job.cp,
        "expert_model_parallel_size": job.ep,
        "use_distributed_optimizer": job.zero >= 1,
        "micro_batch_size": job.micro_batch,
        "sequence_parallel": job.sequence_parallel,
        "recompute_granularity": None if job.recompute == "none" else job.recompute,
    }
