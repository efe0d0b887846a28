"""Byte sizes on the command line: one reader for `data prepare --chunk-size` and
`benchmark collectives --size`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from primus.core.sizes import parse_bytes
from primus.testing.in_process import in_process, primus_here


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("65536", 65536), ("4M", 4 << 20), ("4MiB", 4 << 20), ("512k", 512 << 10),
     ("1.5g", 3 << 29), (" 2 GiB ", 2 << 30), (".5K", 512)],
)  # fmt: skip
def test_sizes_in_bytes_and_binary_units(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize(
    "text", ["", "nan", "inf", "-5", "1e9", "4 parsecs", "M", "4MB", "\u0664M", "\uff14k"]
)  # Arabic-Indic and full-width digits, which int() and float() read
def test_what_is_not_a_size_is_none(text: str) -> None:
    assert parse_bytes(text) is None


@pytest.mark.parametrize("size", ["nan", "inf", "0", "4 parsecs"])
def test_a_chunk_size_that_is_no_size_is_one_line(tmp_path: Path, size: str) -> None:
    with in_process():
        done = primus_here("data", "prepare", "-t", str(tmp_path), "-o", str(tmp_path / "c"),
                           "--chunk-size", size, str(tmp_path / "in.jsonl"))  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", done.stderr).split())  # click's box, unwrapped
    assert f"Invalid value: --chunk-size {size!r}: " in said, said
