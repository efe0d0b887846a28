"""Byte sizes as the command line writes them: 65536, 4M, 4MiB, 1.5g."""

from __future__ import annotations

import re

UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
         "gib": 1 << 30}  # fmt: skip


def parse_bytes(text: str) -> int | None:
    """The bytes of a size such as 65536, 4M, 64MiB or 1.5g (K, M and G count in 1024s), or
    None when `text` is not one."""
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)", text.strip(), re.ASCII)
    if not match or match.group(2).lower() not in UNITS:
        return None
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])
