"""Reading fine-tuning records from local JSONL or parquet, checked record by record.

A record is in one of the formats of `primus.core.posttrain.formats` (chat, prompt/completion,
ShareGPT, Alpaca), read as a chat or a prompt/completion pair; other keys are ignored. A chat
message may carry more keys (`name`, `tool_calls`...): they reach the chat template untouched.
A bad record is a ConfigError at `file:line` (JSONL, lines from 1) or `file: row N` (parquet,
rows from 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, Origin, json_type
from primus.core.posttrain.formats import CONVERTERS, Columns, Invalid, detect


@dataclass(frozen=True)
class Record:
    """One checked record: `messages` for a chat, else `prompt` and `completion`; `format`
    is the one it was written in. A preference record holds its two sides' fields instead
    (`sides`)."""

    where: Origin  # the file and line; for parquet `detail` is "row N"
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    completion: str | None = None
    format: str = "chat"
    train_from: int = 0  # a chat's first message whose assistant turns are trained on
    chosen: dict[str, Any] | None = None
    rejected: dict[str, Any] | None = None

    def error(self, message: str, hint: str | None = None) -> ConfigError:
        return data_error(self.where, message, hint)

    def sides(self) -> tuple[Record, Record]:
        """A preference record as the chosen and the rejected sample's records."""
        assert self.chosen is not None and self.rejected is not None
        kind = "chat" if "messages" in self.chosen else "prompt_completion"
        return (
            Record(self.where, format=kind, **self.chosen),
            Record(self.where, format=kind, **self.rejected),
        )


def data_error(where: Origin, message: str, hint: str | None = None) -> ConfigError:
    """A ConfigError about the record at `where` (file:line, or file: row N)."""
    return ConfigError(f"{where.detail}: {message}" if where.detail else message, where, hint)


# The first bytes of files that are not JSON Lines, and what they are
NOT_TEXT = {
    b"\xff\xfe": "a UTF-16 file (its byte-order mark)",
    b"\xfe\xff": "a UTF-16 file (its byte-order mark)",
    b"\x1f\x8b": "a gzip-compressed file: decompress it first",
}
ONE_PER_LINE = "JSON Lines holds one whole JSON object per line"


def _lone_surrogate(value: Any) -> bool:
    """Whether a string in `value` holds half a UTF-16 surrogate pair (a JSON escape such as
    \\ud800 alone), which is no text: tokenizers cannot read it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return any(_lone_surrogate(item) for item in items)


def _json_hint(line: str, msg: str, number: int) -> str:
    """What a malformed line likely is."""
    head = line.strip()
    if head in ("[", "{") or (number == 1 and head.startswith("[")):
        return (
            f"a JSON array, or an object over several lines? {ONE_PER_LINE} "
            "(jq -c '.[]' converts an array)"
        )
    if "\r" in line.rstrip("\r\n") and msg == "Extra data":
        return (
            f"lines ended by a carriage return (\\r) alone? {ONE_PER_LINE}, ended by \\n or \\r\\n"
        )
    return ONE_PER_LINE


def _jsonl(path: Path) -> Iterator[tuple[Origin, Any]]:
    """The records of a JSONL file, line by line; a UTF-8 byte-order mark is skipped."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            where = Origin("file", str(path), number)
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                what = next(
                    (w for m, w in NOT_TEXT.items() if number == 1 and raw.startswith(m)), None
                )
                raise ConfigError(
                    f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                    + (f": {what}" if what else ""),
                    where,
                    hint="save the file as UTF-8 (JSON Lines is UTF-8 text)",
                ) from None
            if "\x00" in line:
                raise ConfigError(
                    f"a NUL byte (0x00) at column {line.index(chr(0)) + 1}: not text",
                    where,
                    hint="the file is binary, or was cut off while it was written",
                )
            if line.startswith("\ufeff"):
                raise ConfigError(
                    "a byte-order mark (U+FEFF) starts the line: only a file's first line may "
                    "have one", where,
                    hint="files joined with cat keep each one's mark: remove it from this line",
                )  # fmt: skip
            if not line.strip():
                continue
            try:
                data = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"not valid JSON: {exc.msg} (column {exc.colno})",
                    where,
                    hint=_json_hint(line, exc.msg, number),
                ) from None
            if "\\u" in line and _lone_surrogate(data):
                raise ConfigError(
                    "a string holds half a UTF-16 surrogate pair (an escape \\ud800-\\udfff "
                    "alone): not text", where,
                    hint="the program that wrote the file cut a character in two: fix or drop "
                    "the record",
                )  # fmt: skip
            yield where, data


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


def _record(where: Origin, data: Any, format: str, why: str, columns: Columns) -> Record:
    bare = Record(where)
    if not isinstance(data, dict):
        array = isinstance(data, list) and data and all(isinstance(d, dict) for d in data)
        raise bare.error(
            f"a record must be a JSON object, got {json_type(data)}",
            f"a JSON array of records? {ONE_PER_LINE} (jq -c '.[]' converts it)" if array else None,
        )
    data = columns.record(data)
    try:
        found = detect(data, columns, format)
        if format != "auto" and found != format:
            article = "an" if found[0] in "aeiou" else "a"
            if format == "preference":
                raise Invalid(
                    f"{article} {found} record, but the dpo: section trains on preference "
                    "records", hint="each record: prompt, chosen and rejected",
                )  # fmt: skip
            raise Invalid(f"{article} {found} record, but {why} {format}")
        return Record(where, format=found, **CONVERTERS[found](data, columns))
    except Invalid as exc:
        raise bare.error(exc.message, exc.hint) from None


def iter_records(
    path: Path, format: str = "auto", columns: Mapping[str, str] | None = None
) -> Iterator[Record]:
    """The records of a .jsonl or .parquet file, each checked as it is read, its keys read
    through `columns` (sft.columns); one format per file (the first record's when `format`
    is auto)."""
    rows = _parquet(path) if path.suffix == ".parquet" else _jsonl(path)
    first: Record | None = None
    why = "sft.format is"
    mapping = Columns(columns)
    for where, data in rows:
        if first is not None and format == "auto":
            format, why = first.format, "the file's first record is"
        record = _record(where, data, format, why, mapping)
        first = first or record
        yield record
    if first is None:
        what = "it is empty" if path.stat().st_size == 0 else "only blank lines"
        raise ConfigError(
            f"{path}: no records ({what})", hint="a .jsonl file holds one record per line"
        )


def read_records(
    path: Path, format: str = "auto", columns: Mapping[str, str] | None = None
) -> list[Record]:
    """Every record of a .jsonl or .parquet file, checked (`iter_records`)."""
    return list(iter_records(path, format, columns))
