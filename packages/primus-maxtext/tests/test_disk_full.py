"""A full disk during a MaxText run (docs/reliability.md, "Disk full"): the tiny recipe on a
5 MiB tmpfs saving every step (an orbax checkpoint is 1.5 MB, so three fit and the fourth
save fills the disk): one message, exit 1, nothing half-written; grown, the same command
resumes from the last complete checkpoint and finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.core.testing.disk import (
    assert_nothing_half_written,
    assert_one_disk_full_message,
    grow,
    small_disk,
)
from primus.core.testing.runs import losses, primus

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
pytestmark = pytest.mark.slow


def test_a_full_disk_ends_the_run_with_one_message_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    run = ["train", "pretrain", "--config", str(RECIPE), "exp_name=full", "steps=6",
           "learning_rate_schedule_steps=20", "enable_checkpointing=true",
           "checkpoint_period=1"]  # fmt: skip
    with small_disk(tmp_path / "disk", "5m") as disk:
        full = primus(*run, PRIMUS_WORKSPACE=str(disk), HOME=str(tmp_path))
        named = assert_one_disk_full_message(full, disk)
        run_dir = disk / "local" / "local" / "full"
        ckpt = run_dir / "checkpoints"
        complete = max(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
        # orbax saves in the background: the run stops at the first write the main thread
        # sees refused, the save's (named by orbax's error) or the log's after it
        assert named.is_relative_to(run_dir), named
        assert_nothing_half_written(disk)
        grow(disk, "64m")
        resumed = primus(*run, PRIMUS_WORKSPACE=str(disk), HOME=str(tmp_path))
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        log = (run_dir / "logs" / "rank-0.log").read_text()
        assert f"restoring from this run's directory step {complete}" in log
        assert max(losses(run_dir)) == 6
