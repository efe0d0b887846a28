"""The parameter schema kept on disk: read live once per upstream version and adapter code,
then from the cache file; a stale, corrupt or unwritable cache never changes a verdict."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from primus.core.backend.backend_registry import BackendRegistry
from primus.core.config import ParamSchema, ParamSpec, schema_cache
from primus.core.config.schema_cache import cache_file, decode, encode, schema_of


@pytest.fixture
def dummy(tmp_path, monkeypatch):
    """The dummy backend's adapter, its cache in `tmp_path`, and a count of its live reads."""
    monkeypatch.setenv("PRIMUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(schema_cache, "_read", {})
    klass = BackendRegistry.get_adapter_class("dummy")
    reads = []
    live = klass.param_schema

    def counted(self):
        reads.append(1)
        return live(self)

    monkeypatch.setattr(klass, "param_schema", counted)
    return klass("dummy"), reads


def _fresh(monkeypatch) -> None:
    """A new process's view: nothing read yet."""
    monkeypatch.setattr(schema_cache, "_read", {})


def test_read_live_once_then_from_the_file(dummy, monkeypatch) -> None:
    adapter, reads = dummy
    first = schema_of(adapter)
    path = cache_file(adapter)
    assert reads == [1] and path is not None and path.is_file()
    _fresh(monkeypatch)
    second = schema_of(adapter)
    assert reads == [1] and second.specs == first.specs and second.hints == first.hints


def test_a_corrupt_cache_file_is_read_live_and_written_again(dummy, monkeypatch) -> None:
    adapter, reads = dummy
    schema_of(adapter)
    path = cache_file(adapter)
    path.write_text('{"format": 1, "specs": {"lr": [')
    _fresh(monkeypatch)
    assert len(schema_of(adapter)) > 0 and reads == [1, 1]
    assert decode(json.loads(path.read_text())).specs == adapter.param_schema().specs


def test_edited_adapter_code_or_another_upstream_version_names_another_file(
    dummy, monkeypatch
) -> None:
    adapter, _ = dummy
    before = cache_file(adapter)
    source = Path(schema_cache.inspect.getfile(type(adapter)))
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    try:
        edited = cache_file(adapter)
    finally:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(type(adapter), "detect_backend_version", lambda self: "1.99")
    upgraded = cache_file(adapter)
    assert len({before, edited, upgraded}) == 3


def test_an_unwritable_cache_or_a_source_tree_reads_live(dummy, monkeypatch, tmp_path) -> None:
    adapter, reads = dummy
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PRIMUS_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert len(schema_of(adapter)) > 0 and reads == [1]
    _fresh(monkeypatch)
    monkeypatch.setenv("PRIMUS_CACHE_DIR", str(tmp_path / "cache"))
    schema_of(adapter, source_tree=str(tmp_path))
    assert reads == [1, 1] and not (tmp_path / "cache").exists()


def test_every_kind_of_spec_comes_back_as_it_was() -> None:
    schema = ParamSchema(
        {
            "a": ParamSpec(int, "a count", default=3),
            "b": ParamSpec((list, float), choices=(0.5, 1.0), default=[0.5]),
            "c": ParamSpec(None, default=("x", ("y", 1))),
            "d": ParamSpec(dict, open=True, default={"k": [1, None]}),
            "e": ParamSpec(bool, choices=(True,), default=True),
        },
        hints={"--a": "write 'a: 3'"},
    )
    back = decode(json.loads(json.dumps(encode(schema))))
    assert back.specs == schema.specs and back.hints == schema.hints
