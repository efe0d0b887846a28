"""Reading fine-tuning records from local JSONL or parquet, checked record by record.

A record is a chat, `{"messages": [{"role": ..., "content": ...}, ...]}`, or a pair,
`{"prompt": ..., "completion": ...}`; other keys are ignored. A message may carry more keys
(`name`, `tool_calls`...): they reach the chat template untouched. A bad record is a
ConfigError at `file:line` (JSONL, lines from 1) or `file: row N` (parquet, rows from 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, Origin

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Record:
    """One checked record: `messages` for a chat, else `prompt` and `completion`."""

    where: Origin  # the file and line; for parquet `detail` is "row N"
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    completion: str | None = None

    @property
    def format(self) -> str:
        return "chat" if self.messages is not None else "prompt_completion"

    def error(self, message: str, hint: str | None = None) -> ConfigError:
        return data_error(self.where, message, hint)


def data_error(where: Origin, message: str, hint: str | None = None) -> ConfigError:
    """A ConfigError about the record at `where` (file:line, or file: row N)."""
    return ConfigError(f"{where.detail}: {message}" if where.detail else message, where, hint)


def _jsonl(path: Path) -> Iterator[tuple[Origin, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = Origin("file", str(path), number)
            try:
                yield where, json.loads(line.rstrip("\n"))
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"not valid JSON: {exc.msg} (column {exc.colno})", where
                ) from None


def _parquet(path: Path) -> Iterator[tuple[Origin, Any]]:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"{path}: reading parquet needs pyarrow", hint="pip install pyarrow"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several kinds for a file that is not parquet
        raise ConfigError(f"{path}: not a readable parquet file: {exc}") from None
    for row, record in enumerate(table.to_pylist()):
        yield Origin("file", str(path), None, f"row {row}"), record


def _check_message(record: Record, index: int, message: Any) -> None:
    if not isinstance(message, dict):
        raise record.error(f"messages[{index}] is not a mapping")
    role = message.get("role")
    if role is None:
        raise record.error(f"messages[{index}] has no 'role'", hint=f"roles: {', '.join(ROLES)}")
    if role not in ROLES:
        raise record.error(
            f"messages[{index}] has unknown role {role!r}", hint=f"roles: {', '.join(ROLES)}"
        )
    if not isinstance(message.get("content"), str):
        got = type(message.get("content")).__name__ if "content" in message else "none"
        raise record.error(f"messages[{index}] content must be a string, got {got}")


def _record(where: Origin, data: Any, format: str, why: str) -> Record:
    bare = Record(where)
    if not isinstance(data, dict):
        raise bare.error(f"a record must be a JSON object, got {type(data).__name__}")
    chat, pair = "messages" in data, {"prompt", "completion"} <= data.keys()
    if chat == pair:
        keys = "both" if chat else ", ".join(map(repr, data)) or "nothing"
        raise bare.error(
            f"a record needs 'messages' (a chat) or 'prompt' and 'completion', not {keys}"
        )
    found = "chat" if chat else "prompt_completion"
    if format != "auto" and found != format:
        raise bare.error(f"a {found} record, but {why} {format}")
    if found == "prompt_completion":
        for key in ("prompt", "completion"):
            if not isinstance(data[key], str) or not data[key]:
                raise bare.error(f"'{key}' must be a non-empty string, got {data[key]!r}")
        return Record(where, prompt=data["prompt"], completion=data["completion"])
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise bare.error(f"'messages' must be a non-empty list, got {messages!r}")
    record = Record(where, messages=messages)
    for index, message in enumerate(messages):
        _check_message(record, index, message)
    return record


def iter_records(path: Path, format: str = "auto") -> Iterator[Record]:
    """The records of a .jsonl or .parquet file, each checked as it is read; one format per
    file (the first record's when `format` is auto)."""
    rows = _parquet(path) if path.suffix == ".parquet" else _jsonl(path)
    first: Record | None = None
    why = "sft.format is"
    for where, data in rows:
        if first is not None and format == "auto":
            format, why = first.format, "the file's first record is"
        record = _record(where, data, format, why)
        first = first or record
        yield record
    if first is None:
        raise ConfigError(f"{path}: no records")


def read_records(path: Path, format: str = "auto") -> list[Record]:
    """Every record of a .jsonl or .parquet file, checked (`iter_records`)."""
    return list(iter_records(path, format))
