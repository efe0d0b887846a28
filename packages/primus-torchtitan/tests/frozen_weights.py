"""`primus train posttrain` of an experiment in this process, then the model's frozen weights
(every tensor but the LoRA adapters, as the trained model holds them) saved with torch.save.
For the LoRA tests:

    python frozen_weights.py EXP.yaml OUT.pt [OVERRIDES...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from primus.core.patches import PatchContext, register_patch


def main(exp: str, out: str, *overrides: str) -> None:
    from primus.backends.torchtitan.posttrain.lora import is_adapter
    from primus.core.runtime.primus_runtime import PrimusRuntime

    @register_patch("test.frozen_weights", backend="torchtitan", phase="after_train")
    def save(ctx: PatchContext) -> None:
        """the frozen weights after training"""
        from torch.distributed.tensor import DTensor

        (model,) = ctx.extra["trainer"].trainer.model_parts
        state = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()
        }
        torch.save({k: v for k, v in state.items() if not is_adapter(k)}, out)

    PrimusRuntime(Path(exp), list(overrides), "posttrain").run()


if __name__ == "__main__":
    main(*sys.argv[1:])
