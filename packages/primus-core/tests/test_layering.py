"""The layering rules of docs/architecture.md, checked on the source: core never names a
backend, and a backend never imports another."""

import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGES = Path(__file__).parents[2]


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


def test_a_backend_imports_no_other_backend() -> None:
    backends = {p.name for p in PACKAGES.glob("*/src/primus/backends/*") if p.is_dir()}
    assert {"megatron", "torchtitan", "maxtext"} <= backends
    hits = [
        f"{p.relative_to(PACKAGES)}:{n}"
        for name in backends
        for p in PACKAGES.glob(f"*/src/primus/backends/{name}/**/*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        for other in re.findall(r"primus\.backends\.(\w+)", line)
        if other != name
    ]
    assert hits == []
