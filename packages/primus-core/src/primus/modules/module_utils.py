"""Compatibility: the logging helpers the backend guide imports from here.

`from primus.modules.module_utils import log_rank_0` keeps working; new code should use
`primus.core.logging` (`log_rank_0`, `get_logger`), where these names live.
"""

from __future__ import annotations

import logging

from primus.core.logging import get_logger, log_rank_0

__all__ = [
    "debug_rank_0",
    "error_rank_0",
    "log_rank_0",
    "log_rank_all",
    "warning_rank_0",
]


def log_rank_all(message: str, level: int = logging.INFO) -> None:
    """Log on every rank (each rank's log file; the console shows rank 0 unless all ranks log)."""
    get_logger().log(level, message)


def debug_rank_0(message: str) -> None:
    log_rank_0(message, logging.DEBUG)


def warning_rank_0(message: str) -> None:
    log_rank_0(message, logging.WARNING)


def error_rank_0(message: str) -> None:
    log_rank_0(message, logging.ERROR)
