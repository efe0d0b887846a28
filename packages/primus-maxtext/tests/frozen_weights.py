"""`primus train posttrain` of an experiment in this process, then the model's frozen weights
(every parameter but the LoRA adapters, as the trained model holds them) saved with numpy,
by path (`decoder/layers/mlp/wo/kernel`). For the LoRA tests:

    python frozen_weights.py EXP.yaml OUT.npz [OVERRIDES...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from primus.core.patches import PatchContext, register_patch


def main(exp: str, out: str, *overrides: str) -> None:
    from primus.core.runtime.primus_runtime import PrimusRuntime

    @register_patch("test.frozen_weights", backend="maxtext", phase="before_train")
    def save(ctx: PatchContext) -> None:
        """the frozen weights after training (what MaxText's train_loop returns)"""

        def keep(original: Any) -> Any:
            def train_loop(*args: Any, **kwargs: Any) -> Any:
                state = original(*args, **kwargs)
                save_frozen(state, out)
                return state

            return train_loop

        ctx.wrap("maxtext.trainers.pre_train.train", "train_loop", keep)

    PrimusRuntime(Path(exp), list(overrides), "posttrain").run()


def save_frozen(state: Any, out: str) -> None:
    import jax
    import numpy as np

    frozen = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        parts = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        if parts[0] != "model" or "rngs" in parts or any("lora" in p for p in parts):
            continue
        if parts[-1] in ("value", ".value"):  # the nnx.Variable's own
            parts.pop()
        frozen["/".join(parts[1:])] = np.asarray(leaf)
    np.savez(out, **frozen)


if __name__ == "__main__":
    main(*sys.argv[1:])
