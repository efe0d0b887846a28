"""Test only: `python saver.py FOLDER` saves checkpoints 0, 1, 2, ... into FOLDER until it is
killed, with orbax's training Checkpointer built as MaxText 0.2.5 builds it
(maxtext.common.checkpointing.create_orbax_checkpoint_manager: OCDBT, zarr3, async saves, the
item under "items") and waits for each; it prints `committed N` once step N is complete. Step
N's state is 4 MiB of float32 arrays, every value N. (MaxText's checkpointing module itself takes
seconds to import; checker.py uses it to find and load what this wrote.)"""

import sys

import jax.numpy as jnp
from maxtext.common import checkpoint_context
from orbax.checkpoint import v1 as ocp


def state(step: int) -> dict:
    """The train state saved at `step` (MaxText's on-disk layout: params, opt_state, step)."""
    full = jnp.full((256, 1024), step, jnp.float32)
    return {"params": {"params": {"a": full, "b": full}}, "opt_state": [full, full],
            "step": jnp.int32(step)}  # fmt: skip


def main(folder: str) -> None:
    manager = ocp.training.Checkpointer(
        folder,
        context=checkpoint_context.build_context(use_ocdbt=True, use_zarr3=True, partial_load=True),
        save_decision_policy=checkpoint_context.build_save_decision_policy(save_interval_steps=1),
        preservation_policy=checkpoint_context.build_preservation_policy(max_to_keep=None),
    )
    step = 0
    while True:
        manager.save_checkpointables_async(step, {"items": state(step)})
        manager.wait()
        print(f"committed {step}", flush=True)
        step += 1


if __name__ == "__main__":
    main(sys.argv[1])
