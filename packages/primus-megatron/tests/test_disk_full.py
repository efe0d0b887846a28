"""A full disk during a Megatron run (docs/reliability.md, "Disk full"): the tiny recipe on a
6 MiB tmpfs saving every step (a checkpoint is 2.1 MB, so two fit and the third save fills
the disk): one message, exit 1, nothing half-written; grown, the same command resumes from the
last complete checkpoint and finishes."""

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

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
pytestmark = pytest.mark.slow


def test_a_full_disk_ends_the_run_with_one_message_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    run = ["train", "pretrain", "--config", str(RECIPE), "exp_name=full", "train_iters=5",
           "save_interval=1"]  # fmt: skip
    with small_disk(tmp_path / "disk", "6m") as disk:
        full = primus(*run, PRIMUS_WORKSPACE=str(disk))
        named = assert_one_disk_full_message(full, disk)
        run_dir = disk / "local" / "local" / "full"
        ckpt = run_dir / "checkpoints"
        complete = max(int(p.parent.name[5:]) for p in ckpt.glob("iter_*/metadata.json"))
        assert named == ckpt / f"iter_{complete + 1:07d}"  # the save that filled the disk
        assert_nothing_half_written(disk)
        grow(disk, "64m")
        resumed = primus(*run, PRIMUS_WORKSPACE=str(disk))
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        log = (run_dir / "logs" / "rank-0.log").read_text()
        assert f"resumed from {ckpt / f'iter_{complete:07d}'} (iteration {complete})" in log
        assert max(losses(run_dir)) == 5
