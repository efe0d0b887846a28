"""A full disk under two workers (dummy backend, torchrun): every rank's writes are refused,
each at its own file, and the console shows the one message once."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.disk import assert_one_disk_full_message, small_disk
from primus.testing.runs import primus

pytestmark = pytest.mark.slow

DUMMY_QUICKSTART = Path(__file__).parent / "fixtures" / "dummy-quickstart.yaml"


def test_two_workers_on_a_full_disk_show_one_message(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:  # both ranks' logs fill it
        full = primus(
            "train", "pretrain", "--config", str(DUMMY_QUICKSTART), "--nproc-per-node", "2",
            "train_iters=3000", "log_interval=1", PRIMUS_WORKSPACE=str(disk),
        )  # fmt: skip
        assert_one_disk_full_message(full, disk)
        assert full.stderr.count("no space left on device") == 1
