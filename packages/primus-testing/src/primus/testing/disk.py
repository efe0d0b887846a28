"""Disk-full tests: a small tmpfs for a workspace (grown later, as an operator frees space),
what a run that filled it must have left, and the same command run again (docs/reliability.md,
"Disk full")."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from primus.testing.runs import primus

# error: no space left on device writing <path> (<N> MiB free of <M> MiB on <mount>)
MESSAGE = re.compile(
    r"^error: no space left on device writing (?P<path>/\S+) "
    r"\((?P<free>[\d.]+) MiB free of (?P<total>[\d.]+) MiB on (?P<mount>/\S*)\)$"
)
PRIMUS_JSON = ("patch_report.json", "primus_provenance.json", "preempted.json")
_STEP = re.compile(r"(?:iter_|step-)?(\d+)")


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


@dataclass(frozen=True)
class Filled:
    """A run that filled its disk, and the same command run again once the disk grew."""

    run_dir: Path
    named: Path  # the path the message named
    complete: int  # the latest complete checkpoint the full disk left
    log: str  # the resumed run's rank-0 log


def latest_complete(run_dir: Path, marker: str) -> int:
    """The highest step of the checkpoint folders (`iter_N`, `step-N`, `N`) holding `marker`
    (a glob under `run_dir` of the file a backend writes last into a complete one)."""
    steps = [_STEP.fullmatch(p.parent.name) for p in run_dir.glob(marker)]
    return max(int(m[1]) for m in steps if m)


@contextmanager
def filled_then_grown(
    tmp_path: Path, args: list[str], size: str, marker: str, **env: str
) -> Iterator[Filled]:
    """`primus ARGS` (exp_name=full among them) in a workspace on a `size` tmpfs that it
    fills: one message, nothing half-written (asserted); the latest complete checkpoint
    (`latest_complete(run_dir, marker)`) is kept. Grown to 64 MiB, the same command must
    finish (exit 0). The disk stays mounted for the block."""
    with small_disk(tmp_path / "disk", size) as disk:
        env = {**env, "PRIMUS_WORKSPACE": str(disk)}
        full = primus(*args, cwd=None, **env)
        named = assert_one_disk_full_message(full, disk)
        assert_nothing_half_written(disk)
        run_dir = disk / "local" / "local" / "full"
        last = latest_complete(run_dir, marker)
        grow(disk, "64m")
        resumed = primus(*args, cwd=None, **env)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        yield Filled(run_dir, named, last, (run_dir / "logs" / "rank-0.log").read_text())
