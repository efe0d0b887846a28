"""MaxText's AttentionOp on 4 host devices, as MaxText calls it and under the
maxtext.gpu_attention_sharding patch; prints JSON for tests/test_gpu_attention_sharding.py.

The patch is for GPUs: tokamax's Triton kernel cannot run on a CPU, where MaxText routes the
same call to its dot-product attention. The test lets the patch act on "cpu" so that the real
AttentionOp runs the sharded path; the GPU run is in docs/benchmarks/eight-gpus.md.

    python sharded_attention.py WORKSPACE
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import json
from pathlib import Path


def main(workspace: Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax.linen import partitioning
    from jax.sharding import Mesh
    from maxtext.configs import pyconfig
    from maxtext.layers.attention_op import AttentionOp
    from maxtext.utils.maxtext_utils import create_device_mesh

    from primus.backends.maxtext.devices import gpu_attention_sharding as patch
    from primus.testing.runs import preset_args

    args = preset_args(
        workspace, "maxtext", "maxtext_pretrain", "tiny", "maxtext.config_errors",
        hardware="cpu", per_device_batch_size=1, max_target_length=128,
        skip_jax_distributed_system=True,  # one process: no JAX coordinator to start
    )  # fmt: skip
    config = pyconfig.HyperParameters(pyconfig.initialize_pydantic(args.argv))
    mesh = Mesh(create_device_mesh(config), config.mesh_axes)
    op = AttentionOp(
        config, mesh, "autoselected", max_target_length=128,
        num_query_heads=config.num_query_heads, num_kv_heads=config.num_kv_heads,
    )  # fmt: skip
    batch, length, dim = 4, 128, config.head_dim
    keys = jax.random.split(jax.random.key(0), 3)
    query = jax.random.normal(keys[0], (batch, length, config.num_query_heads, dim))
    key, value = (jax.random.normal(k, (batch, length, config.num_kv_heads, dim)) for k in keys[1:])
    segments = jnp.ones((batch, length), jnp.int32).at[:, length // 2 :].set(2)  # two documents
    seen: list[int] = []  # the batch each dot-product attention call was traced with
    dot = AttentionOp.apply_attention_dot

    def spy(self, query, *args, **kwargs):
        seen.append(int(query.shape[0]))
        return dot(self, query, *args, **kwargs)

    AttentionOp.apply_attention_dot = spy

    def run() -> tuple[np.ndarray, list[int], str]:
        def attention(q, k, v, seg):  # a new function each run: nothing from jit's cache
            out, _, _ = op.apply_attention(
                query=q, key=k, value=v, decoder_segment_ids=seg, segment_positions=None,
                lengths=None, model_mode="train", qk_product_einsum=jnp.einsum,
                wv_product_einsum=jnp.einsum,
            )  # fmt: skip
            return out

        seen.clear()
        with jax.set_mesh(mesh), partitioning.axis_rules(config.logical_axis_rules):
            program = jax.jit(attention)
            text = str(jax.make_jaxpr(attention)(query, key, value, segments))
            out = program(query, key, value, segments)
        return np.asarray(out), list(seen), text

    reference, reference_batches, _ = run()
    patch.PLATFORMS.add("cpu")
    AttentionOp.apply_attention = patch.sharded_flash(AttentionOp.apply_attention)
    sharded, sharded_batches, jaxpr = run()
    print(json.dumps({
        "devices": len(jax.devices()),
        "max_abs_difference": float(np.max(np.abs(sharded - reference))),
        "reference_batches": reference_batches,
        "sharded_batches": sharded_batches,
        "shard_map": "shard_map" in jaxpr,
    }))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
