"""What Primus does between two MaxText training steps when a run must stop there: agree across
processes, and save the step just run through MaxText's own (orbax) checkpointing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.logging import log_rank_0

TRAIN = "maxtext.trainers.pre_train.train"  # the module of MaxText's training loop
NO_CHECKPOINT = "no checkpoint (enable_checkpointing is false)"


def largest(number: int) -> int:
    """The largest of every JAX process's `number` (a collective: every process must ask)."""
    import jax

    if jax.process_count() == 1:
        return number
    import numpy as np
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray(number))))


def save_step(jax_device_state: dict[str, Any], python_vars: dict[str, Any], config: Any) -> str:
    """Save the state after MaxText's step `python_vars["step"]` (and the grain iterator's
    position) as orbax step folder `checkpoints/<step>`, which MaxText's resume loads; wait
    until it is complete. Every process must call it. The folder, or NO_CHECKPOINT."""
    from maxtext.common import checkpointing

    manager = python_vars["checkpoint_manager"]
    if manager is None:
        return NO_CHECKPOINT
    step = python_vars["step"]
    state, data = jax_device_state["state"], python_vars["data_iterator"]
    checkpointing.save_checkpoint(manager, step, state, config, data, force=True)  # once a step
    checkpointing.wait_until_finished(manager)
    folder = Path(str(config.checkpoint_dir)) / str(step)
    log_rank_0(f"[maxtext] checkpoint of step {step + 1} (orbax step {step}) complete: {folder}")
    return str(folder)
