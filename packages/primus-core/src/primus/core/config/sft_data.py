"""The data keys of `sft:`: `train` (one file, or several with weights), `eval`, `columns`.
Checked when the experiment loads, without reading a record; each error names the key's
file:line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, Origin, did_you_mean

DATA_SUFFIXES = (".jsonl", ".parquet")
# The record keys each format reads, by the names `sft.columns` maps: a record's own key
# (a column) is read as the key it is mapped to. The message keys are those of each
# message (chat) or turn (sharegpt); the rest are the record's.
MESSAGE_COLUMNS = ("role", "content", "from", "value")
RECORD_COLUMNS = (
    "messages", "prompt", "completion", "conversations",
    "instruction", "input", "output", "system", "history", "chosen", "rejected",
)  # fmt: skip
COLUMNS = (*RECORD_COLUMNS, *MESSAGE_COLUMNS)
ENTRY_KEYS = ("path", "weight", "columns")


@dataclass(frozen=True)
class DataFile:
    """One training file: its path, its weight (None: no weights, the files are concatenated)
    and the columns its records are read with (`sft.columns`, with the entry's own over it)."""

    path: Path
    weight: float | None = None
    columns: Mapping[str, str] = field(default_factory=dict)


def existing_path(value: str, what: str, origin: Origin | None, hint: str) -> Path:
    """`value` as an existing path (absolute), else a ConfigError at `origin`."""
    path = Path(os.path.expanduser(value))  # os.path's: no OSError or RuntimeError, ever
    if not os.path.exists(path):
        raise ConfigError(f"{what}: {path} does not exist", origin, hint)
    return path.resolve()


def refuse_unknown(
    names: Iterable[Any], known: Sequence[str], what: str, origin: Origin | None, hint: str
) -> None:
    """A ConfigError at `origin` ("WHAT 'name' (did you mean: ...)") for the first of `names`
    not in `known`."""
    for name in names:
        if name not in known:
            raise ConfigError(f"{what} {name!r}{did_you_mean(str(name), known)}", origin, hint)


def data_file(value: str, what: str, origin: Origin | None) -> Path:
    """`value` as an existing .jsonl or .parquet file (absolute), else a ConfigError at
    `origin` naming `what` (sft.train, sft.train[1]...)."""
    path = existing_path(value, what, origin, "a .jsonl or .parquet file")
    if not os.path.isfile(path) or path.suffix not in DATA_SUFFIXES:
        raise ConfigError(
            f"{what}: {path} is not a .jsonl or .parquet file",
            origin,
            hint="JSONL: one record per line; parquet: one record per row",
        )
    return path


def check_columns(value: Any, what: str, origins: Mapping[str, Origin | None]) -> dict[str, str]:
    """A column mapping (format key -> the records' own key), checked; `origins[key]` is
    where each key was set, `origins[""]` the mapping's own line."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"{what} must be a mapping of record keys to the data's own keys, got {value!r}",
            origins.get(""),
            hint="e.g. {prompt: question, completion: answer}",
        )
    seen: dict[str, str] = {}
    for key, column in value.items():
        where = origins.get(key) or origins.get("")
        hint = f"record keys: {', '.join(COLUMNS)}"
        refuse_unknown([key], COLUMNS, f"{what}: unknown record key", where, hint)
        if not isinstance(column, str) or not column:
            raise ConfigError(
                f"{what}.{key} must be the name of a key of the records, got {column!r}",
                where,
                hint="e.g. {prompt: question}: the records' 'question' is read as 'prompt'",
            )
        if column in seen:
            raise ConfigError(
                f"{what}: {seen[column]} and {key} both read {column!r}",
                where,
                hint="map each of the data's keys to one record key",
            )
        seen[column] = key
    return dict(value)


def _entry(entry: Any, what: str, origin: Origin | None, columns: dict[str, str]) -> DataFile:
    """One item of a `sft.train` list."""
    if isinstance(entry, str):
        return DataFile(data_file(entry, what, origin), None, columns)
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise ConfigError(
            f"{what} must be a file path or {{path: FILE, weight: W}}, got {entry!r}",
            origin,
            hint="a list of files, or of {path, weight, columns} mappings",
        )
    hint = f"an entry has {', '.join(ENTRY_KEYS)}"
    refuse_unknown(entry, ENTRY_KEYS, f"{what}: unknown key", origin, hint)
    weight = entry.get("weight")
    number = isinstance(weight, int | float) and not isinstance(weight, bool)
    if weight is not None and not (number and math.isfinite(weight) and weight > 0):
        raise ConfigError(
            f"{what}.weight must be a positive number, got {weight!r}",
            origin,
            hint="a weight is the file's share of the training samples (over the weights' sum)",
        )
    if "columns" in entry:
        check_columns(entry["columns"], f"{what}.columns", {"": origin})
        columns = check_columns(columns | entry["columns"], f"{what}.columns", {"": origin})
    path = data_file(entry["path"], what, origin)
    return DataFile(path, None if weight is None else float(weight), columns)


def train_files(
    value: Any, origin: Origin | None, columns: dict[str, str]
) -> tuple[tuple[DataFile, ...], Any]:
    """`sft.train`: one path, or a list of paths or {path, weight, columns} mappings; every
    file or none with a weight. Returns the files and the value as resolved (absolute paths)."""
    if isinstance(value, str):
        path = data_file(value, "sft.train", origin)
        return (DataFile(path, None, columns),), str(path)
    if not value:
        raise ConfigError("sft.train is an empty list", origin, hint="name at least one file")
    files, written = [], []
    for index, entry in enumerate(value):
        file = _entry(entry, f"sft.train[{index}]", origin, columns)
        files.append(file)
        written.append(
            str(file.path) if isinstance(entry, str) else entry | {"path": str(file.path)}
        )
    weighted = [f.weight is not None for f in files]
    if any(weighted) and not all(weighted):
        index = weighted.index(False)
        raise ConfigError(
            f"sft.train[{index}] has no weight, but sft.train[{weighted.index(True)}] has one",
            origin,
            hint="give every file a weight (its share of the training samples), or none",
        )
    return tuple(files), written
