"""The data position of a grain pipeline is global (a sample index), so that a run resumed with
another number of processes reads each remaining sample exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, get_param, register_patch

GRAIN = "maxtext.common.grain_utility"
GLOBAL_POSITION = "global_next_index"  # grain's ElasticIterator state: the next global sample


def _grain_unpacked(ctx: PatchContext) -> bool:
    """dataset_type is grain, grain_file_type arrayrecord, packing false and
    grain_use_elastic_iterator not set"""
    return (
        get_param(ctx, "dataset_type") == "grain"
        and get_param(ctx, "grain_file_type", "arrayrecord") == "arrayrecord"
        and get_param(ctx, "packing") is False
        and get_param(ctx, "grain_use_elastic_iterator") is None
    )


@register_patch(
    "maxtext.grain_global_position",
    backend="maxtext",
    phase="setup",
    condition=_grain_unpacked,
    backend_versions=TESTED,
    target="MaxText config grain_use_elastic_iterator",
    tags=("reliability", "data"),
)
def global_position(ctx: PatchContext) -> None:
    """Read grain data through grain's ElasticIterator: global batch k is samples
    [k*B, (k+1)*B) of the shuffled dataset, split over the processes, and the checkpointed
    position is that sample index, whatever the number of processes."""
    ctx.set_param("grain_use_elastic_iterator", True, "the data position survives a DP change")


def restore_global_position(original: Callable[..., Any]) -> Callable[..., Any]:
    """MaxText's `for_restore`, which also restores a global position saved by another number
    of processes (every process's file holds the same position; MaxText 0.2.5 refuses it for
    grain's ElasticIterator outside Pathways)."""

    def for_restore(manager: Any, step: int, data_iterator: Any, expansion: int) -> Any:
        import jax

        from maxtext.common.grain_utility import GrainCheckpointable

        local = getattr(data_iterator, "local_iterator", data_iterator)
        stored = list((manager.directory / str(step) / "iter").glob("process_*-of-*.json"))
        is_global = not isinstance(local, list) and set(local.get_state()) == {GLOBAL_POSITION}
        if not is_global or len(stored) in (0, jax.process_count()):
            return original(manager, step, data_iterator, expansion)
        return GrainCheckpointable(
            local, restore_process_index=0, restore_process_count=len(stored)
        )

    return for_restore


def _grain(ctx: PatchContext) -> bool:
    """dataset_type is grain"""
    return get_param(ctx, "dataset_type") == "grain"


@register_patch(
    "maxtext.grain_resharded_resume",
    backend="maxtext",
    phase="before_train",
    condition=_grain,
    backend_versions=TESTED,
    target=f"{GRAIN}.for_restore",
    tags=("reliability", "data"),
)
def resharded_resume(ctx: PatchContext) -> None:
    """A grain position that is global (ElasticIterator) is restored whatever number of
    processes saved it: the resumed run continues at the same sample, split over its own."""
    ctx.wrap(GRAIN, "for_restore", restore_global_position)
