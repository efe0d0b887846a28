"""The parameter schema of a backend, kept on disk so that checking an experiment imports no
upstream framework.

An adapter's `param_schema()` reads its upstream (an argparse parser, config dataclasses, a
pydantic model): seconds of imports. `schema_of(adapter)` reads it once per installed upstream
version and Primus adapter code, keeps it as JSON under the user cache
($PRIMUS_CACHE_DIR, else $XDG_CACHE_HOME/primus, else ~/.cache/primus), and later checks read
the file. An upstream source tree on sys.path, an adapter without a distribution or upstream
version, or a schema whose defaults are not plain data is always read live.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.config.schema import ParamSchema, ParamSpec
from primus.core.folders import cache_dir
from primus.core.logging import get_logger

FORMAT = 2  # bump when the file layout changes
_TYPES: dict[str, type] = {t.__name__: t for t in (bool, int, float, str, list, dict)}
_read: dict[type, ParamSchema | None] = {}  # adapter class -> its schema, once per process


class _NotPlain(ValueError):
    """A value JSON cannot hold as it is (its schema is read live)."""


def schema_of(adapter: BackendAdapter, source_tree: str = "") -> ParamSchema | None:
    """`adapter.param_schema()`, from the cache when it holds this upstream and adapter code."""
    klass = type(adapter)
    if klass not in _read:
        _read[klass] = _cached_or_live(adapter, source_tree)
    return _read[klass]


def cached_schema(adapter: BackendAdapter) -> ParamSchema | None:
    """The adapter's schema if the cache holds it, else None (never read live)."""
    return _read_file(cache_file(adapter))


def _read_file(path: Path | None) -> ParamSchema | None:
    if path is None:
        return None
    try:
        return decode(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not cached yet, or unreadable


def _cached_or_live(adapter: BackendAdapter, source_tree: str) -> ParamSchema | None:
    path = None if source_tree else cache_file(adapter)  # named once: it stats the adapter's files
    cached = _read_file(path)
    if cached is not None:
        return cached
    schema = adapter.param_schema()  # not cached yet, or unreadable: read live, written again
    if path is not None and schema is not None:
        _write(path, schema)
    return schema


def cache_file(adapter: BackendAdapter) -> Path | None:
    """The adapter's cache file, named for what the schema depends on; None when that is not
    known (no distribution, no upstream version)."""
    info = BackendRegistry.info(adapter.framework)
    upstream = adapter.detect_backend_version()
    if info.distribution is None or upstream is None:
        return None
    key = json.dumps(
        [FORMAT, adapter.framework, type(adapter).__qualname__, info.distribution,
         info.version, upstream, code_stamp(type(adapter))]
    )  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "schemas" / f"{adapter.framework}-{digest}.json"


def code_stamp(adapter_class: type) -> str:
    """A digest of the adapter package's Python files' names, sizes and modification times:
    an edited editable install reads its schema again."""
    package = Path(inspect.getfile(adapter_class)).parent
    files = sorted(package.rglob("*.py"))
    stamps = [(str(p.relative_to(package)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(repr(stamps).encode()).hexdigest()


def _write(path: Path, schema: ParamSchema) -> None:
    """Keep `schema` at `path` (atomically); a cache that cannot be written is only slower."""
    try:
        text = json.dumps(encode(schema))
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        temp.write_text(text)
        os.replace(temp, path)
    except (OSError, _NotPlain) as exc:
        get_logger().debug(f"parameter schema not cached at {path}: {exc}")


def _plain(value: Any) -> Any:
    """`value` as JSON data; a tuple is tagged so that it comes back a tuple."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple):
        return {"tuple": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _plain(v) for k, v in value.items()}}
    raise _NotPlain(f"{type(value).__name__} {value!r}")


def _unplain(data: Any) -> Any:
    if isinstance(data, list):
        return [_unplain(v) for v in data]
    if isinstance(data, dict):
        if "tuple" in data:
            return tuple(_unplain(v) for v in data["tuple"])
        return {k: _unplain(v) for k, v in data["dict"].items()}
    return data


def _type_names(kind: type | tuple[type, ...] | None) -> list[str] | None:
    if kind is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if any(_TYPES.get(k.__name__) is not k for k in kinds):
        raise _NotPlain(f"type {kind!r}")
    return [k.__name__ for k in kinds]


def encode(schema: ParamSchema) -> dict[str, Any]:
    """The schema as JSON data (`_NotPlain` where it holds more than plain data)."""
    specs = {
        key: [_type_names(s.type), s.help, _plain(s.choices), _plain(s.default), s.open, s.nullable]
        for key, s in schema.specs.items()
    }
    return {"format": FORMAT, "specs": specs, "hints": schema.hints}


def decode(data: dict[str, Any]) -> ParamSchema:
    """The schema `encode` wrote."""
    if data["format"] != FORMAT:
        raise ValueError(f"schema cache format {data['format']}")
    specs = {}
    for key, (names, help_text, choices, default, is_open, nullable) in data["specs"].items():
        kinds = None if names is None else tuple(_TYPES[n] for n in names)
        kind = kinds[0] if kinds is not None and len(kinds) == 1 else kinds
        specs[key] = ParamSpec(
            kind, help_text, _unplain(choices), _unplain(default), is_open, nullable
        )
    return ParamSchema(specs, data["hints"])
