"""The parameters one rank of a TorchTitan job holds, counted on the real model: the experiment's
Trainer.Config built as `primus train` builds it, the model built on the meta device and
parallelized by TorchTitan's own `parallelize_fn` over a fake process group of GPUS ranks.
Prints JSON: {"local": elements of rank 0's shards, "tied_copy": those of the tied embedding's
own shard}. For test_projection.py:

    python sharded_params.py GPUS [KEY=VALUE...]

(On the meta device the tie does not survive sharding: TorchTitan ties the embedding to the
output layer again when it initializes the weights, and the embedding's own shard is left
unused, so the model's parameters are the local count less `tied_copy`.)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from primus.testing.runs import preset_args


def nested(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return out


def main(gpus: int, *pairs: str) -> None:
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    config = preset_args(Path(tempfile.mkdtemp()), "torchtitan", "torchtitan_pretrain",
                         "llama3.2_1B", "torchtitan.cpu", device="cpu", mock_data=True,
                         **nested(list(pairs)))  # fmt: skip
    dist.init_process_group("fake", rank=0, world_size=gpus, store=FakeStore())
    dims = ParallelDims.from_config(config.parallelism, gpus)
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    config.model_spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model = config.model_spec.parallelize_fn(
        model, parallel_dims=dims, training=config.training, parallelism=config.parallelism,
        compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder="",
    )  # fmt: skip

    def local(p: torch.Tensor) -> int:
        return (p.to_local() if isinstance(p, DTensor) else p).numel()

    tied = config.model_spec.model.enable_weight_tying
    print(json.dumps({
        "local": sum(local(p) for p in model.parameters()),
        "tied_copy": local(model.tok_embeddings.weight) if tied else 0,
    }))  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:])
