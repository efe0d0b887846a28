"""GPU flash attention, each GPU on its own sequences.

MaxText 0.2.5 calls tokamax's Pallas-Triton flash attention on GPUs with the global batch. XLA
cannot partition the kernel, so every GPU gathers the whole batch's queries, keys and values
and computes attention for all of them: on 4 H200s the kernel saw q bf16[4,8192,32,128] on
each GPU, and a 16-layer Llama 3.1 8B ran at 53% of one GPU's tokens/s per GPU, with FSDP or
pure data parallelism alike. This patch runs that path under `shard_map` over the batch (and
heads, when tensor parallel), as MaxText already does for the TPU kernel.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch

FLASH_KERNELS = ("flash", "autoselected")
# Where the patched path runs. Tests add "cpu": tokamax's Triton kernel cannot run there, and
# MaxText routes the same call to its dot-product attention, through the same sharding.
PLATFORMS = {"gpu"}
# Arguments of AttentionOp.apply_attention that must keep their defaults for the GPU flash
# path (decode, ragged, chunked prefill, sinks and the rest take other paths or raise).
DEFAULTS = (
    "use_ragged_attention", "previous_chunk", "bidirectional_mask", "sinks", "indexer_mask",
    "compressed_mask", "record_max_logits", "decoder_segment_ids_kv", "pad_kv_total",
    "compress_ratio",
)  # fmt: skip
OP = "maxtext.layers.attention_op"


def _gpu_flash(ctx: PatchContext) -> bool:
    """hardware is a GPU and attention is flash or autoselected"""
    hardware = str(get_param(ctx, "hardware", "tpu"))
    return hardware.startswith("gpu") and get_param(ctx, "attention") in FLASH_KERNELS


def _mesh_size(mesh: Any, axes: Any) -> int:
    """How many devices a PartitionSpec entry (None, an axis or a tuple of axes) spans."""
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[name] for name in names)


def local_specs(op: Any, query: Any, key: Any) -> tuple[Any, Any] | None:
    """The PartitionSpecs of query, key and value ([batch, length, heads, dim]) and of the
    segment ids ([batch, length]) that give each device its own sequences (and heads, where
    they divide), or None when the batch is not sharded or does not divide: then nothing is
    gained and MaxText's call stands."""
    from jax.sharding import PartitionSpec

    from maxtext.common.common_types import BATCH_ATTN, HEAD

    batch = op._logical_to_mesh_axes((BATCH_ATTN,))[0]
    ways = _mesh_size(op.mesh, batch)
    if ways == 1 or query.shape[0] % ways:
        return None
    heads = op._logical_to_mesh_axes((HEAD,))[0]
    head_ways = _mesh_size(op.mesh, heads)
    if query.shape[2] % head_ways or key.shape[2] % head_ways:
        heads = None
    return PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)


def _unset(value: Any, default: Any) -> bool:
    """`value` is the parameter's `default` (an array never is)."""
    return value is default or (isinstance(value, bool | int) and value == default)


def _flash_call(op: Any, arguments: dict[str, Any], signature: inspect.Signature) -> bool:
    """This call (`arguments` of apply_attention's `signature`) takes MaxText's GPU flash path
    (see AttentionOp.apply_attention)."""
    from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE, AttentionType

    platform = op.mesh.devices.flat[0].platform
    defaults = all(_unset(arguments[name], signature.parameters[name].default) for name in DEFAULTS)
    return (
        platform in PLATFORMS
        and op.attention_kernel in FLASH_KERNELS
        and arguments["model_mode"] != MODEL_MODE_AUTOREGRESSIVE
        and arguments["lengths"] is None
        and arguments["query"].shape[-3] >= 128  # shorter: MaxText's dot product
        and op.attention_type != AttentionType.BLOCK_DIFFUSION
        and op._context_parallel_size() == 1
        and defaults
        and all(hasattr(arguments[name], "shape") for name in ("key", "value"))  # no KVTensor
    )


def sharded_flash(original: Callable[..., Any]) -> Callable[..., Any]:
    """AttentionOp.apply_attention that runs the GPU flash path under shard_map."""
    signature = inspect.signature(original)

    def apply_attention(self: Any, *args: Any, **kwargs: Any) -> Any:
        import jax
        from flax.linen import partitioning

        arguments = signature.bind(self, *args, **kwargs).arguments
        arguments = {**{n: p.default for n, p in signature.parameters.items()}, **arguments}
        query, key, segments = (
            arguments["query"],
            arguments["key"],
            arguments["decoder_segment_ids"],
        )
        specs = local_specs(self, query, key) if _flash_call(self, arguments, signature) else None
        if specs is None:
            return original(self, *args, **kwargs)
        qkv, segment_spec = specs
        einsums = {n: arguments[n] for n in ("qk_product_einsum", "wv_product_einsum")}
        mode = arguments["model_mode"]

        def local(q: Any, k: Any, v: Any, *segment_ids: Any) -> Any:
            seg = segment_ids[0] if segment_ids else None
            with partitioning.axis_rules(()):  # each device's own shard: nothing to constrain
                out, _, _ = original(self, q, k, v, seg, None, None, mode, **einsums)
            return out

        inputs = (query, key, arguments["value"], *(() if segments is None else (segments,)))
        in_specs = (qkv, qkv, qkv, *(() if segments is None else (segment_spec,)))
        run = jax.shard_map(
            local, mesh=self.mesh, in_specs=in_specs, out_specs=qkv, check_vma=False
        )
        return run(*inputs), None, None

    return apply_attention


@register_patch(
    "maxtext.gpu_attention_sharding",
    backend="maxtext",
    phase="before_train",
    condition=_gpu_flash,
    backend_versions=TESTED,
    target=f"{OP}.AttentionOp.apply_attention",
    tags=("performance",),
)
def gpu_attention_sharding(ctx: PatchContext) -> None:
    """GPU flash attention under shard_map over the batch (and heads): MaxText calls tokamax's
    kernel with the global batch, which XLA cannot partition, so every GPU computed every
    sequence's attention."""
    from maxtext.layers.attention_op import AttentionOp

    ctx.wrap(AttentionOp, "apply_attention", sharded_flash)
