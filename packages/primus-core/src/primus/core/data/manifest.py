"""PREFIX.json, the manifest of a prepared corpus: what made it (tokenizer, sources, command,
version, date) and what it holds (documents, tokens, token type, end-of-document id)."""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from primus.core.data.sources import Source
from primus.core.data.tokenizer import Eod
from primus.core.errors import ConfigError

FORMAT = "indexed"  # PREFIX.bin + PREFIX.idx, as primus.core.data.indexed describes
# Bump when the same input and options give other bytes: partial output of an older version
# is then started over, never continued.
LAYOUT = 1


def sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fingerprint(sources: list[Source], settings: dict[str, Any]) -> str:
    """What a run's output depends on: the sources (path, size, mtime) and the settings. A
    journal of another fingerprint is another command's: its partial output is not resumed."""
    what = {
        "layout": LAYOUT,
        "sources": [[str(Path(s.path).resolve()), s.size, s.mtime_ns] for s in sources],
        **settings,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class SourceHashes:
    """The sha256 of every source, computed on a thread beside the tokenizing."""

    def __init__(self, sources: list[Source]) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="primus-data-hash")
        self._futures: list[Future[str]] = [self._pool.submit(sha256, s.path) for s in sources]

    def result(self) -> list[str]:
        try:
            return [future.result() for future in self._futures]
        finally:
            self._pool.shutdown()

    def cancel(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Manifest:
    """The counts and settings the manifest records besides the sources."""

    documents: int
    empty_documents_skipped: int
    tokens: int
    dtype: str
    vocab_size: int
    key: str
    chunk_bytes: int
    command: str


def write_manifest(
    path: Path,
    manifest: Manifest,
    eod: Eod | None,
    tokenizer: dict[str, str],
    sources: list[Source],
    hashes: Callable[[], list[str]],
    prefix: Path,
) -> None:
    """Write the manifest to `path` (the caller renames it into place)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        primus_version = version("primus-core")
    except PackageNotFoundError:
        primus_version = "unknown"
    record = {
        "format": FORMAT,
        "bin": f"{prefix.name}.bin",
        "idx": f"{prefix.name}.idx",
        **asdict(manifest),
        "eod": None if eod is None else asdict(eod),
        "tokenizer": tokenizer,  # its path and sha256
        "sources": [
            {"path": str(Path(s.path).resolve()), "format": s.kind, "bytes": s.size, "sha256": h}
            for s, h in zip(sources, hashes(), strict=True)
        ],
        "primus_version": primus_version,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def made_otherwise(
    record: dict[str, Any], sources: list[Source], tokenizer: str, key: str, eod: int | None
) -> str | None:
    """How the corpus a manifest describes was made otherwise than from `sources` with the
    tokenizer of sha256 `tokenizer`, the text under `key` and the end-of-document id `eod`
    (None: none appended), as "made ..."; None when a run of these would write the same
    tokens. The sources are hashed only when everything else agrees."""
    made = record.get("tokenizer") or {}
    if made.get("sha256") != tokenizer:
        return f"made with another tokenizer ({made.get('path') or 'not recorded'})"
    if record.get("key") != key:
        return f"made from the key {json.dumps(record.get('key'))}, not {json.dumps(key)}"
    recorded = (record.get("eod") or {}).get("id")
    if recorded != eod:
        then, now = ("no end-of-document id" if i is None else f"end-of-document id {i}"
                     for i in (recorded, eod))  # fmt: skip
        return f"made with {then}, not {now}"
    listed = record.get("sources")
    if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        return "whose manifest lists no sources"
    paths, read = [str(Path(s.path).resolve()) for s in sources], [s.get("path") for s in listed]
    if read != paths:
        both = min(len(read), len(paths))
        i = next((i for i in range(both) if read[i] != paths[i]), both)  # the first difference
        was, now = (names[i] if i < len(names) else "none" for names in (read, paths))
        return f"made from other input files (input {i + 1} was {was}, here {now})"
    for path, source, entry in zip(paths, sources, listed, strict=True):
        if entry.get("bytes") != source.size or entry.get("sha256") != sha256(source.path):
            return f"made before {path} changed"
    return None


def read_manifest(prefix: str | Path) -> dict[str, Any] | None:
    """The manifest of the corpus at `prefix`, or None when it has none (or an unreadable one,
    or JSON of another format). A ConfigError when it claims the format but a field the readers
    use is missing or of the wrong type."""
    try:
        record = json.loads(Path(f"{prefix}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    problem = _field_problem(record)
    if problem:
        raise ConfigError(f"{prefix}.json, the corpus's manifest: {problem}",
                          hint="make the corpus again with primus data prepare, or remove "
                          "the manifest")  # fmt: skip
    return record


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The fields a manifest must hold, and what each must be: what the readers and inspect use.
REQUIRED = {
    "vocab_size": "a positive integer",
    "documents": "an integer, 0 or more",
    "tokens": "an integer, 0 or more",
    "dtype": "a string",
}


def _field_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a manifest that the readers use, or None."""
    for name, what in REQUIRED.items():
        if name not in record:
            return f"{name} is missing"
        value = record[name]
        ok = isinstance(value, str) if name == "dtype" else _count(value)
        if not ok or (name == "vocab_size" and value == 0):
            return f"{name} must be {what}, got {json.dumps(value)}"
    vocab, eod, tokenizer = record["vocab_size"], record.get("eod"), record.get("tokenizer")
    if eod is not None and not (isinstance(eod, dict) and _count(eod.get("id"))):
        return (
            "eod must be null or hold the end-of-document id (id: an integer), "
            f"got {json.dumps(eod)}"
        )
    if eod is not None and eod["id"] >= vocab:
        return f"the end-of-document id {eod['id']} is outside its vocabulary of {vocab}"
    if tokenizer is not None and not isinstance(tokenizer, dict):
        return f"tokenizer must be null or an object (path, sha256), got {json.dumps(tokenizer)}"
    return None


def description_problem(record: dict[str, Any], prefix: str | Path, documents: int,
                        tokens: int, dtype: str) -> str | None:  # fmt: skip
    """Where the manifest does not describe the corpus at `prefix` (the corpus prepared again
    without it, or a manifest of another corpus), or None: its counts and dtype (not its file
    names: a corpus renamed with its manifest is still the same)."""
    actual = {"documents": documents, "tokens": tokens, "dtype": dtype}
    for key, value in actual.items():
        if key in record and record[key] != value:
            return (
                f"its manifest ({prefix}.json) says {key} {record[key]!r}, the corpus has {value!r}"
            )
    return None


VOCABULARY_HINT = "prepare it with the model's tokenizer, or a model with that vocabulary"


def vocabulary_problem(prefix: str | Path, vocab: Any) -> str | None:
    """Why the corpus at `prefix` does not fit a model of `vocab` token ids (an int; any other
    value is not checked): its manifest's vocabulary is larger or, without a manifest, a token
    id in its .bin is out of range (read when it is at most SCAN_BYTES). None when it fits."""
    if not isinstance(vocab, int):
        return None
    record = read_manifest(Path(prefix).expanduser())
    if record is not None:
        if record["vocab_size"] <= vocab:
            return None
        return (
            f"{prefix} was tokenized with a vocabulary of {record['vocab_size']} (its manifest "
            f"{prefix}.json), more than the model's {vocab}"
        )
    return ids_problem(prefix, vocab, "the model's")


def ids_problem(prefix: str | Path, vocab: int, whose: str) -> str | None:
    """Why a token id in PREFIX.bin lies outside ids 0 to `vocab` - 1 (`whose` vocabulary: "the
    model's"), read when the file is at most SCAN_BYTES; None when none does."""
    from primus.core.data.indexed import id_range

    span = id_range(Path(prefix).expanduser())
    if span is None or (span[0] >= 0 and span[1] < vocab):
        return None
    bad = span[1] if span[1] >= vocab else span[0]
    return (
        f"{prefix}.bin holds token id {bad}, outside {whose} vocabulary of {vocab} "
        f"(ids 0 to {vocab - 1})"
    )


def tokenizer_problem(prefix: str | Path, tokenizer: str | Path) -> str | None:
    """Why the corpus at `prefix` was not tokenized by `tokenizer` (a local tokenizer folder or
    tokenizer.json): its manifest names a tokenizer.json of other content (sha256). None when
    they agree, or when there is no manifest or no local tokenizer.json to compare."""
    record = read_manifest(Path(prefix).expanduser())
    path = Path(tokenizer).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    made = (record or {}).get("tokenizer") or {}
    if not made.get("sha256") or file.name != "tokenizer.json" or not file.is_file():
        return None
    digest = sha256(file)
    if digest == made["sha256"]:
        return None
    return (
        f"{prefix} was tokenized by {made.get('path')} (its manifest {prefix}.json), and "
        f"{file} is another tokenizer (sha256 {digest[:12]}, not {made['sha256'][:12]})"
    )
