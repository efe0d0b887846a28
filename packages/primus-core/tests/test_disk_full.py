"""A full disk under the runtime (in-process toy backend, workspace on a 64 KiB tmpfs): a
write refused deep in a backend, with its cause lost on the way, and a log file the disk
refuses, each end the run as one FileSystemError; what Primus wrote is whole."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from primus.core.errors import FileSystemError
from primus.core.logging import LineFileHandler, get_logger, setup_logging, write_refused
from primus.core.metrics import MetricsSink, step_metrics
from primus.core.runtime import PrimusRuntime
from primus.testing.disk import assert_nothing_half_written, small_disk

from .conftest import RecordingTrainer

EXP = """
    workspace: {ws}
    exp_name: run
    user_name: me
    modules:
      trainer:
        framework: toy
        config: toy_trainer.yaml
"""


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "ws", "64k") as folder:
        yield folder
        setup_logging()  # off the run's log file, its refused write forgotten: later tests log


def _fill(disk: Path) -> None:
    """Fill `disk` to its last byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_save_that_lost_its_os_error_on_a_full_disk_is_one_error_naming_the_run_dir(
    toy_backend: type, write: object, disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = write("exp.yaml", EXP.format(ws=disk))  # type: ignore[operator]

    def train(self: RecordingTrainer) -> None:  # a save that fills the disk, and a writer
        _fill(disk)  # that passes on only the type of the error
        raise RuntimeError("Worker failure: An error is caught, error: <class 'RuntimeError'>")

    monkeypatch.setattr(RecordingTrainer, "train", train)
    runtime = PrimusRuntime(experiment)
    with pytest.raises(FileSystemError) as raised:
        runtime.run()
    assert raised.value.path == str(runtime.run_dir) and raised.value.code == errno.ENOSPC
    assert str(raised.value).startswith(f"no space left on device writing {runtime.run_dir} (")
    assert not (runtime.run_dir / "patch_report.json").exists()  # refused, nothing half
    (disk / "filler").unlink()
    assert_nothing_half_written(disk)


def test_a_log_file_the_disk_refuses_ends_the_run_with_one_error(
    toy_backend: type, write: object, disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = write("exp.yaml", EXP.format(ws=disk))  # type: ignore[operator]

    def train(self: RecordingTrainer) -> None:
        _fill(disk)
        get_logger().info("a line the log file cannot take " + "x" * 5000)
        refused = write_refused()  # kept, not a traceback of logging's
        assert refused is not None and refused.filename == str(log)
        sink = MetricsSink(SimpleNamespace(backend="toy", run_dir=None, params={}))  # type: ignore[arg-type]
        with pytest.raises(OSError) as raised:  # the next step's metrics end the run
            sink.report(step_metrics(1, 2, 0.5, 1.0, 8, 1e9, 1, None), primary=True)
        assert raised.value is refused

    monkeypatch.setattr(RecordingTrainer, "train", train)
    runtime = PrimusRuntime(experiment)
    log = runtime.run_dir / "logs" / "rank-0.log"
    with pytest.raises(FileSystemError) as raised:
        runtime.run()  # the report refused after a run that did not fail: that is the error
    assert raised.value.path == str(runtime.run_dir / "patch_report.json")
    (disk / "filler").unlink()
    assert (
        "a line the log file cannot take"
        not in (runtime.run_dir / "logs" / "rank-0.log").read_text()
    )
    assert_nothing_half_written(disk)


def test_a_record_after_the_log_file_closed_is_dropped_without_logging_s_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = LineFileHandler(tmp_path / "rank-0.log")
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.handle(logging.makeLogRecord({"msg": "before"}))
    handler.close()  # logging's shutdown at exit; a finalizer logs after it
    handler.handle(logging.makeLogRecord({"msg": "after"}))
    assert (tmp_path / "rank-0.log").read_text() == "before\n"
    assert "Logging error" not in capsys.readouterr().err
