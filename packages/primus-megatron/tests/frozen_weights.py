"""`primus train posttrain` of an experiment in this process, saving the model's frozen weights
(every tensor but the LoRA adapters) as the model holds them when training starts and when it
has ended, with torch.save, as {"before": ..., "after": ...}. For the LoRA tests:

    python frozen_weights.py EXP.yaml OUT.pt [OVERRIDES...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from primus.core.patches import PatchContext, register_patch


def frozen(model: list[Any]) -> dict[str, torch.Tensor]:
    """The model's tensors but the adapters, copied."""
    from primus.backends.megatron.posttrain.lora import ADAPTER

    (chunk,) = model
    return {k: v.detach().clone() for k, v in chunk.state_dict().items()
            if ADAPTER not in k and not k.endswith("_extra_state")}  # fmt: skip


def main(exp: str, out: str, *overrides: str) -> None:
    from primus.core.runtime.primus_runtime import PrimusRuntime

    saved: dict[str, Any] = {}

    def capture(setup: Any) -> Any:
        def setup_and_keep(*args: Any, **kwargs: Any) -> Any:
            model, *rest = setup(*args, **kwargs)
            saved["model"], saved["before"] = model, frozen(model)
            return (model, *rest)

        return setup_and_keep

    @register_patch("test.frozen_at_start", backend="megatron", phase="before_train")
    def at_start(ctx: PatchContext) -> None:
        """the frozen weights once the model is set up"""
        ctx.wrap("megatron.training.training", "setup_model_and_optimizer", capture)

    @register_patch("test.frozen_at_end", backend="megatron", phase="after_train")
    def at_end(ctx: PatchContext) -> None:
        """the frozen weights after training"""
        torch.save({"before": saved["before"], "after": frozen(saved["model"])}, out)

    PrimusRuntime(Path(exp), list(overrides), "posttrain").run()


if __name__ == "__main__":
    main(*sys.argv[1:])
