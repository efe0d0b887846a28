"""The input of `primus data prepare`: files and globs, cut into chunks that workers read on
their own, in an order and at boundaries that depend only on the files and the chunk size.

- `.parquet`: the text column (`--key`); a row group is a chunk.
- `.txt`: plain UTF-8 text (a leading byte-order mark dropped), one document per file;
  consecutive files are grouped into chunks.
- anything else: JSON Lines, one JSON object per line, the text under `--key`; blank lines are
  skipped. A chunk is a byte range; a line belongs to the chunk holding its first byte.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, Origin, json_type

KINDS = {".parquet": "parquet", ".txt": "txt"}  # every other suffix: jsonl


@dataclass(frozen=True)
class Source:
    """One input file."""

    path: str
    kind: str  # "jsonl" | "parquet" | "txt"
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Chunk:
    """A unit of work: jsonl bytes [start, stop) of one file; parquet row group `start` (its
    first row `stop`); txt, whole files. `weight`: the input bytes it stands for."""

    kind: str
    paths: tuple[str, ...]
    start: int
    stop: int
    weight: int


class BadInput(Exception):
    """A bad document, raised in a worker: its file, the byte offset of its line (jsonl) and
    the message. Plain arguments, so that it crosses the process boundary whole."""

    def __init__(self, path: str, message: str, offset: int | None = None) -> None:
        super().__init__(path, message, offset)
        self.path, self.message, self.offset = path, message, offset

    def error(self) -> ConfigError:
        """The error to report, the line counted from the offset."""
        line = None if self.offset is None else _line_at(self.path, self.offset)
        hint = "choose the key with --key" if "no key" in self.message else None
        return ConfigError(self.message, Origin("file", file=self.path, line=line), hint)


def _line_at(path: str, offset: int) -> int:
    newlines, left = 0, offset
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(left, 1 << 24))):
            newlines += block.count(b"\n")
            left -= len(block)
    return newlines + 1


def expand(inputs: list[str]) -> list[Source]:
    """The files that `inputs` (paths and globs) name, globs sorted, each once."""
    paths: list[str] = []
    for item in inputs:
        if glob.has_magic(item):
            matches = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"no file matches {item}")
            paths += matches
        elif os.path.isdir(item):
            raise ConfigError(
                f"{item} is a directory", hint=f"pass its files or a glob: '{item}/*.jsonl'"
            )
        elif not os.path.isfile(item):
            raise ConfigError(f"input file not found: {item}")
        else:
            paths.append(item)
    sources = []
    for path in dict.fromkeys(paths):
        stat = os.stat(path)
        kind = KINDS.get(Path(path).suffix.lower(), "jsonl")
        _check_readable(path, kind)
        sources.append(Source(path, kind, stat.st_size, stat.st_mtime_ns))
    return sources


COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


def _check_readable(path: str, kind: str) -> None:
    """A ConfigError for an input the readers would take for JSON Lines and fail on later: a
    compressed file, or a file that holds one JSON array."""
    suffix = Path(path).suffix.lower()
    if suffix in COMPRESSED:
        raise ConfigError(f"{path}: a compressed file ({suffix}) is not read",
                          hint="decompress it first (gunzip -k, xz -dk, ...)")  # fmt: skip
    if kind == "jsonl":
        with open(path, "rb") as file:
            head = file.read(4096).lstrip()
        if head.startswith(b"["):
            raise ConfigError(
                f"{path}: one JSON array; data prepare reads JSON Lines (an object per line)",
                hint=f"write it as JSON Lines: jq -c '.[]' {path} > {Path(path).stem}.jsonl",
            )


def plan(sources: list[Source], chunk_bytes: int, key: str) -> list[Chunk]:
    """The chunks of `sources`, in order. Parquet files are checked for the text column here."""
    chunks: list[Chunk] = []
    for kind, run in itertools.groupby(sources, key=lambda source: source.kind):
        if kind == "txt":
            chunks += _txt_chunks(list(run), chunk_bytes)
            continue
        for source in run:
            if kind == "parquet":
                chunks += _parquet_chunks(source, key)
                continue
            for start in range(0, source.size, chunk_bytes):
                stop = min(start + chunk_bytes, source.size)
                chunks.append(Chunk("jsonl", (source.path,), start, stop, stop - start))
    return chunks


def _txt_chunks(files: list[Source], chunk_bytes: int) -> list[Chunk]:
    """Consecutive text files, grouped until a group holds `chunk_bytes`."""
    chunks: list[Chunk] = []
    paths: list[str] = []
    size = 0
    for file in files:
        paths.append(file.path)
        size += file.size
        if size >= chunk_bytes:
            chunks.append(Chunk("txt", tuple(paths), 0, 0, size))
            paths, size = [], 0
    if paths:
        chunks.append(Chunk("txt", tuple(paths), 0, 0, size))
    return chunks


def _parquet_file(path: str) -> Any:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(
            f"{path}: reading parquet needs pyarrow", hint="pip install 'primus-core[data]'"
        ) from exc
    try:
        return pq.ParquetFile(path)
    except Exception as exc:
        raise ConfigError(f"not a parquet file: {exc}", Origin("file", file=path)) from None


def _parquet_chunks(source: Source, key: str) -> list[Chunk]:
    import pyarrow as pa  # type: ignore[import-untyped]

    parquet = _parquet_file(source.path)
    schema = parquet.schema_arrow
    where = Origin("file", file=source.path)
    if key not in schema.names:
        columns = ", ".join(schema.names) or "none"
        hint = "choose the column with --key"
        raise ConfigError(f"no column '{key}' (columns: {columns})", where, hint)
    kind = schema.field(key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"column '{key}' holds {kind}, not strings", where)
    meta = parquet.metadata
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    total, chunks, first = max(sum(rows), 1), [], 0
    for group, count in enumerate(rows):
        weight = source.size * (first + count) // total - source.size * first // total
        chunks.append(Chunk("parquet", (source.path,), group, first, weight))
        first += count
    return chunks


def texts(chunk: Chunk, key: str) -> Iterator[str]:
    """The documents of a chunk; a bad one raises BadInput."""
    if chunk.kind == "jsonl":
        yield from _jsonl_texts(chunk.paths[0], chunk.start, chunk.stop, key)
    elif chunk.kind == "txt":
        for path in chunk.paths:
            data = Path(path).read_bytes()
            try:
                yield data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is no text
            except UnicodeDecodeError as exc:
                raise BadInput(path, f"not UTF-8 text: byte {exc.start}") from None
    else:
        yield from _parquet_texts(chunk.paths[0], chunk.start, chunk.stop, key)


def _parquet_texts(path: str, group: int, first_row: int, key: str) -> Iterator[str]:
    table = _parquet_file(path).read_row_group(group, columns=[key])
    for row, text in enumerate(table.column(0).to_pylist(), start=first_row + 1):
        if text is None:
            raise BadInput(path, f"row {row}: '{key}' is null")
        yield text


def _jsonl_texts(path: str, start: int, stop: int, key: str) -> Iterator[str]:
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the rest of a line that the chunk before holds
        at = f.tell()
        if at >= stop:
            return
        block = f.read(stop - at)
        if not block.endswith(b"\n"):
            block += f.readline()  # the last line runs past `stop`: it is this chunk's
    for line in block.split(b"\n"):
        if line.strip():
            yield _text(line, key, path, at)
        at += len(line) + 1


def _text(line: bytes, key: str, path: str, offset: int) -> str:
    try:
        record = json.loads(line)
    except ValueError as exc:
        reason = f"{exc.msg}: column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        raise BadInput(path, f"not valid JSON: {reason}", offset) from None
    if not isinstance(record, dict):
        raise BadInput(path, f"expected a JSON object, got {json_type(record)}", offset)
    if key not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise BadInput(path, f"no key '{key}' (keys: {keys})", offset)
    text = record[key]
    if not isinstance(text, str):
        raise BadInput(path, f"'{key}' must be a string, got {json_type(text)}", offset)
    if b"\\u" in line.lower() and _unpaired_surrogate(text):  # JSON escapes can make one
        raise BadInput(path, f"'{key}' holds an unpaired UTF-16 surrogate (not text)", offset)
    return text


def _unpaired_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
