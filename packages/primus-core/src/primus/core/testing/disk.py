"""Disk-full tests: a small tmpfs for a workspace (grown later, as an operator frees space), and
what a run that filled it must have left (docs/reliability.md, "Disk full")."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

# error: no space left on device writing <path> (<N> MiB free of <M> MiB on <mount>)
MESSAGE = re.compile(
    r"^error: no space left on device writing (?P<path>/\S+) "
    r"\((?P<free>[\d.]+) MiB free of (?P<total>[\d.]+) MiB on (?P<mount>/\S*)\)$"
)
PRIMUS_JSON = ("patch_report.json", "primus_provenance.json", "preempted.json")


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: 64k, 6m) mounted at `folder` (made) for the block,
    unmounted after; the test is skipped where mounting is not permitted (not root, no
    CAP_SYS_ADMIN, a container without it)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs at {folder}: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def grow(folder: Path, size: str) -> None:
    """Resize the tmpfs at `folder` to `size`, its files kept."""
    resized = _mount("-o", f"remount,size={size}", str(folder))
    assert resized.returncode == 0, resized.stderr


def assert_one_disk_full_message(result: subprocess.CompletedProcess[str], disk: Path) -> Path:
    """The run exited 1 with exactly one `error:` message naming a path on `disk` and the free
    space of `disk` (a hint after it), no traceback; the path named."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert "Traceback" not in output, output[-6000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors or result.stderr[-3000:]
    match = MESSAGE.match(errors[0])
    assert match, errors[0]
    assert Path(match["mount"]) == disk and Path(match["path"]).is_relative_to(disk), errors[0]
    assert float(match["free"]) < 1.0 and float(match["total"]) > 0, errors[0]
    assert "  hint: free space on " in result.stderr, result.stderr[-2000:]
    return Path(match["path"])


def assert_nothing_half_written(disk: Path) -> None:
    """No empty file and no atomic write's temporary file under `disk`; Primus's JSON and YAML
    files parse, and metrics.jsonl and the logs end with a whole line."""
    files = [p for p in disk.rglob("*") if p.is_file()]
    assert [p for p in files if p.stat().st_size == 0] == []
    assert [p for p in files if p.name.startswith(".") and p.name.endswith(".tmp")] == []
    for path in files:
        if path.name in PRIMUS_JSON:
            json.loads(path.read_text())
        elif path.name == "config.resolved.yaml":
            yaml.safe_load(path.read_text())
        elif path.name == "metrics.jsonl" or (path.parent.name == "logs" and path.suffix == ".log"):
            text = path.read_text()
            assert text.endswith("\n"), f"{path} ends in a torn line: {text[-200:]!r}"
            if path.name == "metrics.jsonl":
                assert all(json.loads(line) for line in text.splitlines())
