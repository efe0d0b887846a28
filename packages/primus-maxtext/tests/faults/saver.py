"""Test only: `python saver.py FOLDER` saves checkpoints 0, 1, 2, ... into FOLDER until it is
killed, with orbax's training Checkpointer built as MaxText 0.2.5 builds it
(maxtext.common.checkpointing.create_orbax_checkpoint_manager: OCDBT, zarr3, async saves, the
item under "items") and waits for each; it prints `committed N` once step N is complete. Step
N's state is 4 MiB of float32 arrays, every value N. (MaxText's checkpointing module itself takes
seconds to import; checker.py uses it to find and load what this wrote.)

`python saver.py` (no folder) imports once and forks the savers: for each FOLDER read on stdin, a
process saving into FOLDER, its output appended to FOLDER.out; it answers the saver's pid."""

import os
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


def serve() -> None:
    """Fork a saver per folder read on stdin (module docstring). A saver that ended stays a
    zombie (not alive to the test) until the next folder, or the end of stdin."""
    for line in sys.stdin:
        reap()
        pid = os.fork()
        if pid == 0:
            folder = line.strip()
            os.dup2(os.open(f"{folder}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)
            try:
                main(folder)
            finally:
                os._exit(1)
        print(pid, flush=True)
    reap()


def reap() -> None:
    """Wait for the savers that ended."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


if __name__ == "__main__":
    if len(sys.argv) == 1:
        serve()
    else:
        main(sys.argv[1])
