"""MaxText's jobs as the memory projection sees them (`primus.core.projection`), read from the
resolved config (`MaxTextArgs.config`): no JAX device is touched.

Bytes, as MaxText's train step keeps them:

- weights in `weight_dtype` (float32 by default; matmuls cast them to `dtype` on the fly), no
  master copy besides: the optimizer updates them in place;
- gradients in the weights' dtype, float32 ones cast to `grad_dtype`; with gradient
  accumulation twice that (the accumulator and one micro batch's);
- adamw: mu in `mu_dtype` (the weights' unless set) and nu in the weights' dtype; adam_pax: both
  in the weights'; muon: its momentum; sgd: nothing;
- activations in `dtype`. MaxText remats every scanned decoder layer (`jax.checkpoint`):
  `full`, and `none` (no policy), keep the layer inputs; `minimal` the projections' outputs
  (`save_only_these_names` of query, key, value, out, mlpwi_0, mlpwi_1, mlpwo: core's
  `projections` recompute), `minimal_with_context` also the attention output (a little more),
  the `save_dot_*` policies some of them (an upper bound); `save_qkv_proj`, `save_out_proj`,
  the offloaded and custom ones a little more than full (projected as full: a lower bound).
  While full remat recomputes a layer and runs its backward, it holds two layers' worth
  (`recompute_working_set`: the recomputed activations and their gradients; with 2 the runs
  in docs/benchmarks, 1B and 8B, 1 to 4 GPUs, are within 9%; with 1, the 8B ones 5-11% under);
- logits: at the peak, the logits in `dtype` and their gradient in `dtype` (measured: the
  float32 softmax does not outlive its fusion); `num_vocab_tiling` chunks divide that.

Layout: MaxText's mesh, ici x dcn per axis, the -1 axis filling the GPUs left. `tensor` is tp
(the activations' embedding dimension is split too: sequence parallel), `context` (and
`context_usp_ulysses`) cp, `expert` ep. `data`, `fsdp`, `fsdp_transpose` and `expert` are the
data-parallel ranks: weights sharded over the last three (ZeRO stage 3; MaxText shards them over
`context` too, which the projection does not count), replicated over `data` (stage 1 with
`shard_optimizer_over_data`). `per_device_batch_size` is sequences per GPU: a tensor or context
parallel group shares its GPUs' sequences.
"""

from __future__ import annotations

import math
import os
from typing import Any

from primus.core.errors import ConfigError
from primus.core.projection import Job, Model, check_recompute, data_parallel

# tokamax's Pallas-Triton flash attention (`attention: flash`) against cuDNN's, taken to reach
# the device's flash-attention rate: the 8B recipe cut to 4 layers on an H100 ran 23.6 ms a
# step slower with it, where the projection gives cuDNN's 27.5 ms (maxtext-cudnn-attention JSON)
TOKAMAX_ATTENTION_SHARE = 0.54

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DATA_AXES = ("data", "fsdp", "fsdp_transpose", "expert")
SHARDING_AXES = ("fsdp", "fsdp_transpose", "expert")  # the axes weights are sharded over
MODELLED = (*DATA_AXES, "tensor", "context", "context_usp_ulysses")
PROJECTIONS = ("minimal", "minimal_with_context", "minimal_flash", "minimal_with_quantization",
             "minimal_with_context_and_quantization", "save_dot_with_context_except_mlp",
             "save_dot_except_mlpwi", "save_dot_except_mlp")  # fmt: skip


def _bytes(config: dict[str, Any], key: str) -> int:
    name = str(config[key])
    if name not in BYTES:
        raise ConfigError(f"maxtext: the projection does not know {key} '{name}'")
    return BYTES[name]


def model(config: dict[str, Any]) -> Model:
    """The model MaxText builds from `config` (it does not pad the vocabulary)."""
    experts = config["num_experts"] if config["num_experts"] > 1 else 0
    if experts and (config["shared_experts"] or config["first_num_dense_layers"]):
        raise ConfigError("maxtext: the projection does not model shared experts or dense layers")
    moe_ffn = config["base_moe_mlp_dim"]
    return Model(
        layers=config["base_num_decoder_layers"],
        hidden=config["base_emb_dim"],
        heads=config["base_num_query_heads"],
        kv_heads=config["base_num_kv_heads"],
        head_dim=config["head_dim"],
        ffn=moe_ffn if experts and moe_ffn > 0 else config["base_mlp_dim"],
        vocab=config["vocab_size"],
        tied=bool(config["logits_via_embedding"]),
        gated=len(config["mlp_activations"]) == 2,
        qkv_bias=bool(config["attention_bias"]),
        qk_norm=bool(config["use_qk_norm"]),
        experts=experts,
        experts_per_token=config["num_experts_per_tok"] if experts else 0,
    )


def checkpoint_bytes(config: dict[str, Any], lora: bool) -> int | None:
    """About the bytes of one checkpoint of the run `config` describes (the params over
    MaxText's defaults): every weight in weight_dtype and (unless `lora` freezes them) Adam's
    two fp32 moments. None when the run saves none, or its model is not all in the params."""
    sizes = ("base_num_decoder_layers", "base_emb_dim", "base_num_query_heads",
             "base_num_kv_heads", "head_dim", "base_mlp_dim", "vocab_size")  # fmt: skip
    if not config["enable_checkpointing"] or not all(isinstance(config[k], int) for k in sizes):
        return None
    try:
        parameters = model(config).parameters()
        weight = _bytes(config, "weight_dtype")
    except (ConfigError, KeyError, TypeError):  # a model the projection does not describe
        return None
    return parameters * (weight + (0 if lora else 8))


def mesh(config: dict[str, Any], gpus: int) -> dict[str, int]:
    """Each mesh axis's size on `gpus` GPUs (ici x dcn)."""
    axes = config["mesh_axes"]
    slices = max(1, config["num_slices"])
    dcn = dict(zip(axes, config["dcn_parallelism"], strict=True))
    fixed_dcn = math.prod(v for v in dcn.values() if v != -1)
    sizes = {a: (slices // fixed_dcn if v == -1 else v) for a, v in dcn.items()}
    ici = dict(zip(axes, config["ici_parallelism"], strict=True))
    fill = [a for a, v in ici.items() if v == -1]
    if fill and fill[0] not in DATA_AXES:
        raise ConfigError(f"maxtext: the projection needs the -1 (fill) on a data axis, not "
                          f"ici_{fill[0]}_parallelism")  # fmt: skip
    for axis, size in ici.items():
        sizes[axis] *= 1 if size == -1 else size
    unmodelled = [a for a, v in sizes.items() if v > 1 and a not in MODELLED]
    if unmodelled:
        raise ConfigError(f"maxtext: the projection does not model the '{unmodelled[0]}' axis")
    dp = data_parallel(gpus, sizes["tensor"], 1, sizes["context"] * sizes["context_usp_ulysses"])
    others = math.prod(sizes[a] for a in DATA_AXES)
    if dp % others or (not fill and dp != others):
        raise ConfigError(f"maxtext: --gpus {gpus} leaves {dp} data-parallel ranks, which the "
                          f"data axes ({others} fixed) do not fill")  # fmt: skip
    if fill:
        sizes[fill[0]] *= dp // others
    return sizes


def _command_buffers() -> bool:
    """Whether XLA replays the step's kernels as CUDA graphs (its default on GPUs; an empty
    --xla_gpu_enable_command_buffer= turns them off)."""
    return "--xla_gpu_enable_command_buffer=" not in os.environ.get("XLA_FLAGS", "").split()


def training_job(args: Any, gpus: int, applied: frozenset[str]) -> Job:
    """The job MaxText's config `args.config` describes on `gpus` GPUs (module docstring)."""
    config = args.config
    sizes = mesh(config, gpus)
    shape = model(config)
    tp, cp = sizes["tensor"], sizes["context"] * sizes["context_usp_ulysses"]
    dp = math.prod(sizes[a] for a in DATA_AXES)
    sharded = math.prod(sizes[a] for a in SHARDING_AXES)
    if sharded > 1 and sizes["data"] > 1:
        raise ConfigError(
            "maxtext: the projection cannot shard weights over fsdp and replicate them over data",
            hint="set one of ici_fsdp_parallelism and ici_data_parallelism to 1",
        )
    zero = 3 if sharded > 1 else (1 if config["shard_optimizer_over_data"] else 0)
    per_group = config["per_device_batch_size"] * tp * cp
    if per_group != int(per_group):
        raise ConfigError(f"maxtext: per_device_batch_size x tp x cp ({per_group}) is not a "
                          "whole number of sequences")  # fmt: skip
    weight, act = _bytes(config, "weight_dtype"), _bytes(config, "dtype")
    grad = _bytes(config, "grad_dtype") if weight == 4 else weight
    accumulation = config["gradient_accumulation_steps"]
    mu = _bytes(config, "mu_dtype") if config.get("mu_dtype") else weight
    moments = {"adamw": mu + weight, "adam_pax": 2 * weight, "muon": mu, "sgd": 0}
    kernel = config["attention"]  # autoselected on an NVIDIA GPU: cuDNN's (maxtext.cudnn_attention)
    flash = kernel != "dot_product" and not (
        kernel == "autoselected"
        and (config["hardware"] == "cpu" or config["max_target_length"] < 128)
    )
    return Job(
        model=shape,
        micro_batch=int(per_group),
        seq_len=config["max_target_length"],
        tp=tp,
        cp=cp,
        ep=sizes["expert"] if shape.experts else 1,  # a dense model's expert axis: data
        dp=dp,
        weight_bytes=weight,
        grad_bytes=grad * (2 if accumulation > 1 else 1),
        optimizer_bytes=moments[config["opt_type"]],
        zero=zero,
        activation_bytes=act,
        sequence_parallel=tp > 1,
        flash_attention=flash,
        attention_rate_share=TOKAMAX_ATTENTION_SHARE if kernel == "flash" else 1.0,
        recompute="projections" if config["remat_policy"] in PROJECTIONS else "full",
        recompute_working_set=2.0,
        logit_bytes=2 * act / max(1, config["num_vocab_tiling"]),
        global_batch=int(per_group) * dp * accumulation,
        fused_kernels=True,  # XLA fuses the norms, RoPE, SwiGLU and the loss's elementwise work
        cuda_graphs=_command_buffers(),
        overlap_grad_reduce=True,  # XLA's async collectives overlap the gradients' reduction
    )


def _sequences(sequences: int, devices: int) -> int | float:
    """Sequences per device: a whole number as an int (a share below one stays a fraction)."""
    return sequences // devices if sequences % devices == 0 else sequences / devices


def layout_overrides(job: Job) -> dict[str, Any]:
    """MaxText's keys for `job`'s layout (on one slice). The micro batches of a step are
    gradient accumulation steps, or with a pipeline its micro batches (MaxText splits each
    device's batch; the projection itself does not model MaxText's pipeline)."""
    check_recompute(job, "MaxText", ("projections", "full"))  # it remats every layer
    replicas = job.dp // job.ep
    count = job.global_batch // (job.micro_batch * job.dp) if job.global_batch else 1
    keys = {
        "ici_tensor_parallelism": job.tp,
        "ici_pipeline_parallelism": job.pp,
        "ici_context_parallelism": job.cp,
        "ici_expert_parallelism": job.ep,
        "ici_fsdp_parallelism": replicas if job.zero >= 3 else 1,
        "ici_data_parallelism": 1 if job.zero >= 3 else replicas,
        "shard_optimizer_over_data": job.zero in (1, 2),
        "per_device_batch_size": _sequences(job.micro_batch, job.tp * job.cp),
        "gradient_accumulation_steps": count,
        "remat_policy": "minimal" if job.recompute == "projections" else "full",
    }
    if job.pp > 1:
        per_device = _sequences(job.micro_batch * count, job.tp * job.pp * job.cp)
        keys |= {"per_device_batch_size": per_device, "gradient_accumulation_steps": 1,
                 "num_pipeline_microbatches": count}  # fmt: skip
    return keys
