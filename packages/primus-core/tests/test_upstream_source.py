"""Constants read from an installed package's source without importing it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from primus.core.backend.upstream_source import source_defaults

SOURCE = """
import this_module_does_not_exist  # never run: the source is parsed, not imported

class Rope:
    def scale(self, x, low=1.0, high=4.0, *, window=8192, name=compute()):
        return x

    class Config:
        low: float = 1.0
        high: float = 4
        unset: int
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fakeupstream" / "models").mkdir(parents=True)
    (tmp_path / "fakeupstream" / "__init__.py").write_text("raise ImportError('not importable')\n")
    (tmp_path / "fakeupstream" / "models" / "rope.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fakeupstream"


def test_defaults_of_a_method_and_of_a_nested_class(package: str) -> None:
    method = source_defaults(package, "models/rope.py", "Rope.scale")
    assert method == {"low": 1.0, "high": 4.0, "window": 8192}  # not the call
    assert source_defaults(package, "models/rope.py", "Rope.Config") == {"low": 1.0, "high": 4}
    assert package not in sys.modules


def test_a_missing_file_or_owner_is_none(package: str) -> None:
    assert source_defaults(package, "models/gone.py", "Rope.scale") is None
    assert source_defaults(package, "models/rope.py", "Rope.gone") is None
    assert source_defaults("no_such_package_here", "x.py", "f") is None
