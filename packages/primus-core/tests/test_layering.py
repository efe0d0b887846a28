"""The layering rule of docs/architecture.md, checked on the source: core never names a backend."""

import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"


def test_core_names_no_backend() -> None:
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"megatron|torchtitan|maxtext", line, re.IGNORECASE)
    ]
    assert hits == []


def test_core_names_no_test_kit() -> None:
    """primus.testing (the primus-testing distribution) serves tests: core works without it."""
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"primus\.(core\.)?testing", line)
    ]
    assert hits == []
