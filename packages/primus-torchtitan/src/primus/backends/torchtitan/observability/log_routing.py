"""TorchTitan logs to the root logger; its records go to Primus's logger (console and rank log)."""

from __future__ import annotations

from primus.core.logging import LogRouter
from primus.core.patches import PatchContext, register_patch


@register_patch(
    "torchtitan.logging",
    backend="torchtitan",
    phase="setup",
    target="logging root logger (torchtitan.tools.logging.logger)",
    tags=("observability",),
)
def route_logs(ctx: PatchContext) -> None:
    """Send TorchTitan's INFO logs (step lines, checkpoints, warnings) to Primus's logger."""
    LogRouter("torchtitan").attach("")
