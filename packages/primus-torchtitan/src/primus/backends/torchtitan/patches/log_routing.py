"""TorchTitan logs to the root logger; its records go to Primus's logger (console and rank log)."""

from __future__ import annotations

import logging

from primus.core.logging import get_logger
from primus.core.patches import PatchContext, register_patch


class ToPrimus(logging.Handler):
    """Hands root-logger records to `primus.torchtitan` (Primus's handlers, rank filter, files)."""

    def emit(self, record: logging.LogRecord) -> None:
        get_logger("torchtitan").handle(record)


@register_patch(
    "torchtitan.logging",
    backend="torchtitan",
    phase="setup",
    target="logging root logger (torchtitan.tools.logging.logger)",
    tags=("observability",),
)
def route_logs(ctx: PatchContext) -> None:
    """Send TorchTitan's INFO logs (step lines, checkpoints, warnings) to Primus's logger."""
    root = logging.getLogger()
    if not any(isinstance(h, ToPrimus) for h in root.handlers):
        root.addHandler(ToPrimus())
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
