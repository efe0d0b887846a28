"""Helpers for backend tests that train for real: a `primus train` subprocess and its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def primus(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`primus ARGS` in a subprocess (the installed CLI of this interpreter), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "primus.cli", *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def train_run(config: Path, workspace: Path, *overrides: str, nproc: int = 1) -> Path:
    """Run `primus train pretrain --config config` (exp_name=... among the overrides) in
    `workspace`; assert it succeeded and return its run directory."""
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    result = primus(
        "train", "pretrain", "--config", str(config), *launch, *overrides,
        PRIMUS_WORKSPACE=str(workspace),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    name = next(o.split("=", 1)[1] for o in overrides if o.startswith("exp_name="))
    return next(workspace.rglob(name))


def step_metrics(run_dir: Path) -> list[dict]:
    """Every line of the run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    """Step -> loss from the run's metrics.jsonl."""
    return {m["step"]: m["loss"] for m in step_metrics(run_dir)}


def assert_loss_falls(curve: dict[int, float], by: float = 0.5) -> None:
    steps = sorted(curve)
    first, last = curve[steps[0]], curve[steps[-1]]
    assert last < first - by, f"loss did not fall by {by}: {first:.3f} -> {last:.3f}"
