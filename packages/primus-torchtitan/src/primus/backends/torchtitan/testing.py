"""Helpers for TorchTitan's tests (on the CPU and on the GPU): an experiment's runtime in this
process, and the tokens of its first training step."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from primus.core.patches import restore_all


@contextmanager
def runtime(exp: Path, *overrides: str) -> Iterator[Any]:
    """`primus`'s runtime for `exp` in this process; the environment and the names the patches
    replaced are put back afterwards."""
    from primus.core.runtime.primus_runtime import PrimusRuntime

    saved = dict(os.environ)
    try:
        yield PrimusRuntime(exp, list(overrides))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        restore_all()


def first_batch(exp: Path, *overrides: str) -> torch.Tensor:
    """The tokens (local batch, seq + 1) of the first step of a mock-data run of `exp` on one
    rank, as the run's own dataloader draws them: inputs, then the last label."""
    with runtime(exp, *overrides) as rt:
        config = rt.backend_args()
        loader = config.dataloader.build(
            dp_world_size=1,
            dp_rank=0,
            tokenizer=config.tokenizer.build(tokenizer_path=config.hf_assets_path),
            seq_len=config.training.seq_len,
            local_batch_size=config.training.local_batch_size,
        )
        inputs, labels = next(iter(loader))
    return torch.cat([inputs["input"], labels[:, -1:]], dim=1)
