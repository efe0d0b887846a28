"""Projection: the memory model of a training job (`memory`), the public face backends build
their `Job` with, and the performance projection over it (`performance`)."""

from primus.core.projection.memory import (
    GIB,
    RECOMPUTE,
    Job,
    Model,
    Projection,
    check_recompute,
    data_parallel,
    project,
    unsaved_matmul_share,
)

__all__ = [
    "GIB",
    "RECOMPUTE",
    "Job",
    "Model",
    "Projection",
    "check_recompute",
    "data_parallel",
    "project",
    "unsaved_matmul_share",
]
