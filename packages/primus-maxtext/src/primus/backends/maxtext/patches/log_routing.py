"""MaxText logs through absl; its records go to Primus's logger (console and rank log)."""

from __future__ import annotations

import logging

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.logging import get_logger
from primus.core.patches import PatchContext, register_patch


class ToPrimus(logging.Handler):
    """Hands records to `primus.maxtext`: MaxText's own from INFO, other libraries' (orbax,
    grain, ...) from WARNING."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or "/maxtext/" in record.pathname:
            get_logger("maxtext").handle(record)


@register_patch(
    "maxtext.logging",
    backend="maxtext",
    phase="setup",
    priority=1,
    backend_versions=TESTED,
    target="absl logger (maxtext.utils.max_logging), logging 'maxtext' logger",
    tags=("observability",),
)
def route_logs(ctx: PatchContext) -> None:
    """Send MaxText's INFO logs (step lines, checkpoints, config warnings) to Primus's logger;
    absl's verbosity becomes INFO, as MaxText's own entry point sets it."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    for name in ("absl", "maxtext"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, ToPrimus) for h in logger.handlers):
            logger.addHandler(ToPrimus())
        logger.propagate = False  # a root handler someone else installed would print it twice
