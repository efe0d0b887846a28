"""A full disk during a TorchTitan run (docs/reliability.md, "Disk full"): the tiny recipe on a
6 MiB tmpfs saving every step (a checkpoint is 2.4 MB, so two fit and the third save fills
the disk): one message, exit 1, nothing half-written; grown, the same command resumes from the
last complete checkpoint and finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.disk import filled_then_grown
from primus.testing.runs import losses

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"
pytestmark = pytest.mark.slow


def test_a_full_disk_ends_the_run_with_one_message_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    run = ["train", "pretrain", "--config", str(RECIPE), "exp_name=full", "training.steps=5",
           "lr_scheduler.total_steps=20", "metrics.log_freq=1", "checkpoint.enable=true",
           "checkpoint.keep_latest_k=0", "checkpoint.interval=1"]  # fmt: skip
    with filled_then_grown(tmp_path, run, "6m", "checkpoint/step-*/.metadata") as filled:
        ckpt, last = filled.run_dir / "checkpoint", filled.complete
        assert filled.named == ckpt / f"step-{last + 1}"  # the save that filled the disk
        assert f"Loading the checkpoint from {ckpt}/step-{last}." in filled.log
        assert max(losses(filled.run_dir)) == 5
