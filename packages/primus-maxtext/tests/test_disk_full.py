"""A full disk during a MaxText run (docs/reliability.md, "Disk full"): the tiny recipe on a
5 MiB tmpfs saving every step (an orbax checkpoint is 1.5 MB, so three fit and the fourth
save fills the disk): one message, exit 1, nothing half-written; grown, the same command
resumes from the last complete checkpoint and finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.disk import filled_then_grown
from primus.testing.runs import losses

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
pytestmark = pytest.mark.slow


def test_a_full_disk_ends_the_run_with_one_message_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    run = ["train", "pretrain", "--config", str(RECIPE), "exp_name=full", "steps=6",
           "learning_rate_schedule_steps=20", "enable_checkpointing=true",
           "checkpoint_period=1"]  # fmt: skip
    with filled_then_grown(
        tmp_path, run, "5m", "checkpoints/*/commit_success.txt", HOME=str(tmp_path)
    ) as filled:
        # orbax saves in the background: the run stops at the first write the main thread
        # sees refused, the save's (named by orbax's error) or the log's after it
        assert filled.named.is_relative_to(filled.run_dir), filled.named
        assert f"restoring from this run's directory step {filled.complete}" in filled.log
        assert max(losses(filled.run_dir)) == 6
