"""Rank-aware logging on the standard library: a file per rank, the console on rank 0.

The console shows a logged exception's message without its traceback below DEBUG (`--debug`
shows it); the rank's file always has it. Each record is appended to the file whole
(`primus.core.reliability.atomic.append_record`): a full disk leaves no torn line, and a write the file
system refuses is kept for `write_refused` instead of printing logging's own traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from primus.core.errors import REFUSED
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.reliability.atomic import append_record

LOGGER_NAME = "primus"
_FORMAT = "%(asctime)s %(levelname)s [rank%(rank)s] %(name)s: %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _Console(logging.Formatter):
    """A formatter without the tracebacks of logged exceptions (unless `tracebacks`)."""

    def __init__(self, fmt: str, tracebacks: bool) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks or not (record.exc_info or record.exc_text or record.stack_info):
            return super().format(record)
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


_refused: list[OSError] = []


def write_refused() -> OSError | None:
    """The first write to a log file that its file system refused (full, over quota,
    read-only), or None. Logging cannot end the run where it fails (an upstream's thread, a
    `finally`); the run checks this at each step's metrics and at its end."""
    return _refused[0] if _refused else None


class LineFileHandler(logging.Handler):
    """Appends each record to `path` with one write; a full file system's refusal is kept
    (`write_refused`) and the record dropped, whole. Once closed (logging's shutdown at exit)
    it drops records: a finalizer's record after that (an upstream's unretrieved asyncio
    future) still reaches the console, not a "Logging error" traceback."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd < 0:
            return
        try:
            data = (self.format(record) + "\n").encode(errors="backslashreplace")
            append_record(self.fd, data, self.path)
        except OSError as exc:
            if exc.errno not in REFUSED:
                self.handleError(record)
            elif not _refused:
                _refused.append(exc)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        super().close()


def get_logger(name: str | None = None) -> logging.Logger:
    """The Primus logger, or a child of it (`get_logger("mybackend")` -> "primus.mybackend")."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def setup_logging(
    level: str = "INFO", log_dir: Path | None = None, console_all_ranks: bool = False
) -> Path | None:
    """Log to `log_dir/rank-N.log` (appending) and, on rank 0 (or every rank), to stderr."""
    rank = get_torchrun_env().rank
    logger = get_logger()
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    _refused.clear()  # a new run's files (a process may run several: tests, conversions)
    logger.setLevel(level)
    logger.propagate = False
    rank_filter = _RankFilter(rank)
    if rank == 0 or console_all_ranks:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(
            _Console(
                "[primus] %(message)s"
                if rank == 0 and not console_all_ranks
                else f"[primus rank{rank}] %(message)s",
                tracebacks=logger.getEffectiveLevel() <= logging.DEBUG,
            )
        )
        console.addFilter(rank_filter)
        logger.addHandler(console)
    log_file = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_file = log_dir / f"rank-{rank}.log"
        handler = LineFileHandler(log_file)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(rank_filter)
        logger.addHandler(handler)
    return log_file


def log_rank_0(message: str, level: int = logging.INFO) -> None:
    """Log on rank 0 only (the original backend guide's `log_rank_0`)."""
    if get_torchrun_env().rank == 0:
        get_logger().log(level, message)


class LogRouter(logging.Handler):
    """Hands an upstream's log records to `primus.<name>` (Primus's handlers, rank filter, files).

    A record passes from `level`, or from `levels[fragment]` when the path of the file that
    logged it holds `fragment`: `levels={"/someframework/": INFO}, level=WARNING` passes the
    framework's own INFO records and other libraries' warnings.
    """

    def __init__(
        self, name: str, level: int = logging.INFO, levels: Mapping[str, int] | None = None
    ) -> None:
        self.levels = dict(levels or {})
        super().__init__(min([level, *self.levels.values()]))
        self.least = level
        self.target = get_logger(name)

    def emit(self, record: logging.LogRecord) -> None:
        least = next((v for k, v in self.levels.items() if k in record.pathname), self.least)
        if record.levelno >= least:
            self.target.handle(record)

    def attach(self, *loggers: str) -> None:
        """Route the named loggers ("" is the root) here instead of to their parents, replacing
        a router to the same Primus logger; each lets through at least this router's levels."""
        for name in loggers:
            logger = logging.getLogger(name or None)
            for old in [h for h in logger.handlers if isinstance(h, LogRouter)]:
                if old.target is self.target:
                    logger.removeHandler(old)
            logger.addHandler(self)
            logger.setLevel(min(logger.getEffectiveLevel(), self.level))
            logger.propagate = False  # a root handler someone else installed would print twice
