"""TorchTitan's jobs as the memory projection sees them (`primus.core.projection`).

TorchTitan 0.3 wraps every model in FSDP2, on one GPU too: the parameters stay in
`training.dtype` (fp32) as the optimizer's master copy, sharded over the data-parallel shard
degree; each layer runs on a `mixed_precision_param` (bf16) copy gathered for its forward and
backward; the sharded gradients are in the parameters' dtype, and so are AdamW's two moments
(bf16 with `optimizer.implementation: fused_opt_states_bf16`). Hence 4 + 4 + 8 bytes a
parameter, sharded as ZeRO stage 3 over the shard degree; a replicate degree above 1 keeps that
many copies (HSDP: `zero_replicas`), or whole ones with a shard degree of 1 (DDP: stage 0).
With `peft:` (LoRA) the model's weights are frozen: only the adapters have gradients and
moments. A tied embedding keeps its own fp32 shard besides the output layer's: parallelizing on
the meta device breaks the tie, TorchTitan ties the two again when it initializes the weights,
and the embedding's shard stays allocated, unused (4 bytes an element, `tied_copy_bytes`; 0.98
GiB for the 1B recipe on one GPU, measured).

Its loss (`ChunkedLossWrapper`) runs the output layer and the cross-entropy over 1/`num_chunks`
of the tokens at a time, forward and backward: upstream's cross-entropy keeps an fp32
log-softmax of the chunk and, in its backward, two fp32 gradients (12 bytes a logit); a fused
one (turbo's kernel, or the loss compiled) the bf16 logits and their gradient (4).

Its selective checkpointing (`SelectiveAC`) is per op: it saves the outputs of the matmuls but
every second one (the fused qkv, the MLP's w1 and w2 of llama3's five) and of the attention
(with its fp32 log-sum-exp), and the checkpoint keeps each layer's input: core's
`alternate_matmuls`, 34.9 kB a layer and token for the 1B recipe.

The loss also holds the output layer (`loss_output_layer_bytes`; the gradient shard:
`loss_output_layer_sharded_bytes`): with more than one chunk it keeps the layer's weight
gathered (bf16, 2 bytes an element: reshard after forward and backward off), accumulates its
gradient unsharded over the chunks with gradient sync off (fp32, FSDP's reduce dtype: 4), and
at the last chunk reduce-scatters it: an fp32 input (4) and the new gradient shard (4 / shard
degree). 14 bytes per vocabulary x hidden element on one GPU, what a
CPU trace of the real step had measured; 3.42 GiB for the 1B recipe. All layers' activations
are still alive then: the decoder's backward starts after the loss.

With CUDA graphs off (`training.disable_cuda_graphs`, the CPU, pipeline parallelism) the
optimizer's zero_grad frees the gradients between steps: none exists at the peak (the loss and
the start of the backward), and they grow as the backward frees the activations, so the peak is
weights + moments + the larger of the activations with the loss and the gradients
(`gradients_kept` false). The graph keeps its gradients (zeroed), so with graphs they add up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.errors import ConfigError
from primus.core.projection import Job, Model, check_recompute, data_parallel

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# per logit of one chunk: upstream's fp32 log-softmax and its two fp32 gradients; fused: the
# bf16 logits and their gradient
LOSS_CHUNK_BYTES = {"upstream": 12, "fused": 4}
# per output-layer element while the chunked loss runs: the gathered bf16 weight (2), the fp32
# gradient accumulated unsharded over the chunks (4) and, at the last chunk, the reduce-scatter's
# fp32 input (4); its output, the new gradient shard (4 / shard degree), comes on top
LOSS_OUTPUT_LAYER_BYTES = 2 + 4 + 4
REDUCED_GRAD_BYTES = 4
TURBO = {"torchtitan.turbo_rms_norm", "torchtitan.turbo_swiglu", "torchtitan.turbo_cross_entropy"}
FLASH = ("FlexAttention", "ScaledDotProductAttention", "VarlenAttention")
# Fitted to profiles of the 1B and 8B (16 and 32 layers, 1 and 4 GPUs) recipes on H200s,
# 2026-11-27 (docs/operations.md): FlexAttention's share of the device's flash-attention rate
# (0.74-0.86 eager, 0.62-0.82 compiled), and the passes over a layer's activations the
# memory-bound kernels make (eager 3.45-4.40; compiled per block, which leaves the layout
# copies, casts and the saved activations' writes: 2.95-3.65)
FLEX_ATTENTION_SHARE = 0.8
ELEMENTWISE_PASSES = {False: 3.9, True: 3.3}  # by whether the model is compiled
# TorchTitan's policy -> core's recompute (SelectiveAC saves every second mm's output and the
# attention's: core's alternate_matmuls; MemoryBudgetAC's compiler-chosen set: approximated)
RECOMPUTE = {"SelectiveAC": "alternate_matmuls", "FullAC": "full", "MemoryBudgetAC": "selective"}
MODES = {"none": "none", "alternate_matmuls": "selective", "full": "full"}  # core -> mode key


def model(config: Any) -> Model:
    """The decoder `config.model_spec.model` describes (its first layer's shape for all)."""
    spec = config.model_spec.model
    layers = spec.layers
    attention = layers[0].attention
    qkv = attention.qkv_linear
    projection = getattr(qkv, "wqkv", None) or qkv.wq  # fused, or the query's of three
    heads = attention.n_heads
    moe = next((layer.moe for layer in layers if getattr(layer, "moe", None)), None)
    experts = moe.routed_experts.inner_experts if moe is not None else None
    return Model(
        layers=len(layers),
        hidden=spec.dim,
        heads=heads,
        kv_heads=attention.n_kv_heads or heads,
        head_dim=attention.head_dim or qkv.head_dim,
        ffn=experts.hidden_dim if experts else layers[0].feed_forward.w1.out_features,
        vocab=spec.vocab_size,
        tied=bool(spec.enable_weight_tying),
        qkv_bias=bool(projection.bias),
        qk_norm=attention.qk_norm is not None,
        experts=moe.num_experts if moe is not None else 0,
        experts_per_token=moe.router.top_k if moe is not None else 0,
    )


def checkpoint_bytes(params: dict[str, Any], value: Callable[[str], Any], lora: bool) -> int | None:
    """About the bytes of one checkpoint of the run `params` describe (`value`: a dotted key's
    value, or TorchTitan's default): every weight, and (unless `lora` freezes them) Adam's two
    moments, all in `training.dtype`. None when the run saves none, or its model is not all in
    the params."""
    m: dict[str, Any] = params.get("model") or {}
    keys = ("dim", "n_layers", "n_heads", "ffn_hidden_dim", "vocab_size")
    sizes: list[Any] = [m.get(k) for k in keys]
    if not value("checkpoint.enable") or not all(isinstance(size, int) for size in sizes):
        return None
    dim, layers, heads, ffn, vocab = sizes
    model = Model(
        layers=layers, hidden=dim, heads=heads, kv_heads=m.get("n_kv_heads") or heads,
        head_dim=m.get("head_dim") or dim // heads, ffn=ffn, vocab=vocab,
        tied=bool(m.get("tie_embeddings")), qk_norm=m.get("family") == "qwen3",
    )  # fmt: skip
    weight = 2 if value("training.dtype") == "bfloat16" else 4
    return model.parameters() * weight * (1 if lora else 3)


def _data_parallel(parallelism: Any, gpus: int, tp: int, pp: int, cp: int) -> tuple[int, int]:
    """(replicate, shard) degrees on `gpus` GPUs; a ConfigError when they do not fill them."""
    dp = data_parallel(gpus, tp, pp, cp)
    replicate, shard = (
        parallelism.data_parallel_replicate_degree,
        parallelism.data_parallel_shard_degree,
    )
    if shard == -1 and dp % replicate == 0:
        shard = dp // replicate
    if replicate * shard != dp:
        shown = "-1 (the rest)" if parallelism.data_parallel_shard_degree == -1 else shard
        raise ConfigError(
            f"--gpus {gpus} leaves {dp} data-parallel ranks, not data_parallel_replicate_degree "
            f"{replicate} x data_parallel_shard_degree {shown}",
            hint=f"pass --gpus {replicate * max(shard, 1) * tp * pp * cp}",
        )
    return replicate, shard


def adapter_parameters(config: Any) -> int:
    """The LoRA adapters' parameters (`peft:`): A (rank x in) and B (out x rank) of each
    adapted Linear, one pair per targeted part (its rows) of the fused q/k/v linear."""
    from primus.backends.torchtitan.posttrain.lora import adapted_linears

    def rows(c: Any) -> list[int]:
        return list(c.part_rows().values()) if hasattr(c, "part_rows") else [c.out_features]

    linears = adapted_linears(config).values()
    return sum(c.rank * (c.in_features + out) for c in linears for out in rows(c))


def training_job(config: Any, gpus: int, applied: frozenset[str]) -> Job:
    """TorchTitan's `Trainer.Config` on `gpus` GPUs (the module docstring says what it keeps)."""
    p, training = config.parallelism, config.training
    tp, pp, cp, ep = (p.tensor_parallel_degree, p.pipeline_parallel_degree,
                      p.context_parallel_degree, p.expert_parallel_degree)  # fmt: skip
    replicate, shard = _data_parallel(p, gpus, tp, pp, cp)
    if (shard * cp * tp) % ep:
        raise ConfigError(f"expert_parallel_degree {ep} does not divide data_parallel_shard_degree "
                          f"{shard} x context {cp} x tensor {tp}")  # fmt: skip
    master = BYTES[training.dtype]
    groups = config.optimizer.param_groups
    moments = 2 if all(g.optimizer_name.startswith("Adam") for g in groups) else 1
    moment_bytes = 2 if config.optimizer.implementation == "fused_opt_states_bf16" else master
    compiled = config.compile.enable
    compiled_model = compiled and "model" in config.compile.components
    fused = compiled_model or applied >= TURBO
    fused_loss = (compiled and "loss" in config.compile.components) or (
        "torchtitan.turbo_cross_entropy" in applied
    )
    chunks = getattr(config.loss, "num_chunks", 0)  # 0: no ChunkedLossWrapper
    ac = config.activation_checkpoint
    first = config.model_spec.model.layers[0]
    attention = type(first.attention.inner_attention).__qualname__.removesuffix(".Config")
    dp = replicate * shard
    # no graph under pipeline parallelism (layout_overrides) or on the CPU
    graphs = not training.disable_cuda_graphs and "torchtitan.cpu" not in applied and pp == 1
    return Job(
        model=model(config),
        micro_batch=training.local_batch_size,
        seq_len=training.seq_len,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        dp=dp,
        weight_bytes=master,
        grad_bytes=master,
        optimizer_bytes=moments * moment_bytes,
        zero=0 if shard == 1 and replicate > 1 else 3,
        zero_replicas=replicate,
        adapter_parameters=adapter_parameters(config),
        tied_copy_bytes=master,  # the tied embedding's own shard, left stale (module docstring)
        activation_bytes=BYTES[training.mixed_precision_param],
        sequence_parallel=tp > 1 and bool(p.enable_sequence_parallel),
        flash_attention=attention.startswith(FLASH),
        attention_rate_share=FLEX_ATTENTION_SHARE if attention == "FlexAttention" else 1.0,
        fused_qkv=getattr(first.attention.qkv_linear, "wqkv", None) is not None,
        recompute="none" if ac is None else RECOMPUTE[type(ac).__qualname__.split(".")[0]],
        logit_bytes=LOSS_CHUNK_BYTES["fused" if fused_loss else "upstream"] / max(chunks, 1),
        loss_output_layer_bytes=LOSS_OUTPUT_LAYER_BYTES if chunks > 1 else 0,
        loss_output_layer_sharded_bytes=REDUCED_GRAD_BYTES if chunks > 1 else 0,
        # without a graph zero_grad frees them: none exists until the backward
        gradients_kept=graphs,
        global_batch=(
            training.global_batch_size
            if training.global_batch_size > 0
            else training.local_batch_size * dp
        ),
        fused_kernels=fused,
        # measured without turbo's kernels; with them the fused default (1) stands
        elementwise_passes=None if applied >= TURBO else ELEMENTWISE_PASSES[compiled_model],
        cuda_graphs=graphs,
        overlap_grad_reduce=True,  # FSDP2 reduce-scatters each layer's gradients in the backward
    )


def layout_overrides(job: Job) -> dict[str, Any]:
    """TorchTitan's keys for `job`'s layout (data-parallel sharding fills the rest; TorchTitan
    captures no CUDA graph under pipeline parallelism)."""
    check_recompute(job, "TorchTitan", tuple(MODES))
    keys: dict[str, Any] = {
        "parallelism.tensor_parallel_degree": job.tp,
        "parallelism.pipeline_parallel_degree": job.pp,
        "parallelism.context_parallel_degree": job.cp,
        "parallelism.expert_parallel_degree": job.ep,
        # TorchTitan's default, moot without tensor parallelism
        "parallelism.enable_sequence_parallel": job.sequence_parallel or job.tp == 1,
        "training.local_batch_size": job.micro_batch,
        # -1: one micro batch a data-parallel rank, no accumulation
        "training.global_batch_size": (
            -1 if job.global_batch in (0, job.micro_batch * job.dp) else job.global_batch
        ),
        "activation_checkpoint.mode": MODES[job.recompute],
    }
    if job.pp > 1:
        keys["training.disable_cuda_graphs"] = True
    return keys
