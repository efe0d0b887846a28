"""Files written whole or not at all (primus.core.reliability.atomic), and a refused write as one message
(primus.core.errors.FileSystemError), on a real 64 KiB tmpfs that fills."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from primus.core.errors import ConfigError, FileSystemError, filesystem_error, refused_writes
from primus.core.metrics import read_metrics
from primus.core.reliability.atomic import (
    append_line,
    atomic_file,
    check_replaceable,
    write_atomic,
    write_json,
)
from primus.testing.disk import small_disk

ROOM = re.compile(r"\((\d+\.\d) MiB free of 0\.1 MiB on (/\S+)\)")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", "64k") as folder:
        yield folder


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_file(disk: Path) -> None:
    report = disk / "patch_report.json"
    write_atomic(report, '{"old": true}\n')
    with pytest.raises(OSError) as refused:
        write_atomic(report, "x" * 200_000)  # more than the disk holds: ENOSPC halfway
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(report)
    assert report.read_text() == '{"old": true}\n'
    assert list(disk.iterdir()) == [report]
    with pytest.raises(ValueError), atomic_file(report) as out:  # any failure in the block
        out.write("new")
        raise ValueError("stopped")
    assert report.read_text() == '{"old": true}\n' and list(disk.iterdir()) == [report]


def test_a_new_file_gets_the_mode_a_plain_write_would_and_a_rewrite_keeps_its_own(
    tmp_path: Path,
) -> None:
    plain, atomic = tmp_path / "plain", tmp_path / "atomic"
    plain.write_text("a")
    write_atomic(atomic, "a")
    assert atomic.stat().st_mode == plain.stat().st_mode
    os.chmod(atomic, 0o600)
    write_atomic(atomic, b"b")
    assert atomic.stat().st_mode & 0o777 == 0o600 and atomic.read_bytes() == b"b"


def test_a_file_where_no_folder_can_hold_it_is_a_config_error(tmp_path: Path) -> None:
    """A path a user named (`--json`, `--out`) under a file or a folder that is not there: one
    error naming it, not an OSError's traceback."""
    (tmp_path / "a-file").write_text("x")
    for path, why in ((tmp_path / "a-file" / "r.json", "a-file is not a folder"),
                      (tmp_path / "none" / "r.json", f"no folder {tmp_path / 'none'}")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"cannot write {path}: .*{why}"):
            write_atomic(path, "{}")


def test_an_append_the_disk_cuts_short_is_taken_back(disk: Path) -> None:
    metrics = disk / "metrics.jsonl"
    for step in (1, 2):
        append_line(metrics, json.dumps({"step": step}))
    before = metrics.read_bytes()
    with pytest.raises(OSError) as refused:  # written in part, then ENOSPC: truncated back
        append_line(metrics, json.dumps({"step": 3, "pad": "x" * 100_000}))
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(metrics)
    assert metrics.read_bytes() == before
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]


def test_a_reader_of_metrics_skips_a_torn_last_line(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # a writer killed mid-line
    assert read_metrics(metrics) == [{"step": 1}, {"step": 2}]


def test_a_refused_write_is_one_message_with_the_path_and_the_free_space(disk: Path) -> None:
    path = disk / "run" / "checkpoints" / "iter_0000003"  # not there: its nearest folder counts
    full = filesystem_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)))
    assert isinstance(full, FileSystemError) and full.exit_code == 1
    text = f"{full.label}: {full}"
    first, hint = text.split("\n")
    assert first.startswith(f"error: no space left on device writing {path} (")
    room = ROOM.search(first)
    assert room and room[2] == str(disk), first
    assert hint == (
        f"  hint: free space on {disk} (or move the workspace to another file system), then "
        "run the same command again: a training run resumes from its last complete checkpoint"
    )
    assert full.report_key() == f"error: no space left on device on {disk}"  # one per mount
    quota = filesystem_error(OSError(errno.EDQUOT, "Disk quota exceeded", str(path)))
    assert quota and str(quota).startswith(f"disk quota exceeded writing {path} (")
    assert "hint: free space within your quota on" in str(quota)
    read_only = filesystem_error(OSError(errno.EROFS, "Read-only file system", str(path)))
    assert read_only and str(read_only).startswith(f"read-only file system writing {path} (")
    assert f"hint: make {disk} writable" in str(read_only)


class CheckpointException(BaseException):
    """As torch.distributed.checkpoint raises it: each rank's failure, with its traceback."""

    def __init__(self, msg: str, failures: dict[int, tuple[BaseException, object]]) -> None:
        super().__init__(msg, failures)


def _torch_save_failure() -> RuntimeError:
    """torch.save into a stream on a full disk: the OSError only as the context, no file."""
    failure = RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598")
    failure.__context__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return failure


def test_a_refusal_is_found_however_an_upstream_wraps_it(disk: Path, tmp_path: Path) -> None:
    folder = disk / "checkpoint" / "step-3"
    dcp = CheckpointException("write failed", {0: (_torch_save_failure(), None)})
    found = filesystem_error(dcp, folder)
    assert found and found.code == errno.ENOSPC and found.path == str(folder)
    orbax = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "a/c/0" in OCDBT database at local file "/ws/3.tmp/": '
        'Failed writing: "/ws/3.tmp/d/11fe": Failed to write 616087 bytes to file 36: No space '
        "left on device [os_error_code='28']"
    )
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = orbax  # the text only, as orbax passes a TensorStore error on
    found = filesystem_error(wrapped)
    assert found and found.path == "/ws/3.tmp/d/11fe"
    assert filesystem_error(ConfigError("Read-only file system")) is None  # its own message
    lost = RuntimeError("Worker failure: <class 'RuntimeError'>")  # a writer that kept only this
    assert filesystem_error(lost, tmp_path) is None  # a folder with room: not a full disk
    (disk / "filler").write_bytes(bytes(60 << 10))  # 4 KiB left
    found = filesystem_error(lost, folder)  # the file system refuses a write now
    assert found and found.code == errno.ENOSPC and found.path == str(folder)
    assert [p.name for p in disk.iterdir()] == ["filler"]  # the probe removed
    with pytest.raises(FileSystemError) as raised, refused_writes(folder):
        raise lost
    assert raised.value.path == str(folder) and raised.value.__cause__ is lost


def test_a_read_only_file_system_is_found_by_the_probe(disk: Path) -> None:
    remount = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount {disk} read-only: {remount.stderr.decode().strip()}")
    found = filesystem_error(RuntimeError("a save failed"), disk / "checkpoints")
    assert found and found.code == errno.EROFS and str(found).startswith("read-only file system")


@pytest.mark.parametrize("folder", ["", ".", "..", "/", "../.."])
def test_the_current_folder_or_one_above_it_is_never_replaced(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checkpoint tiny --hf '' --force` tried to swap out the folder the user stood in."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    with pytest.raises(ConfigError, match="is the current folder or holds it"):
        check_replaceable(Path(folder), replace=True)
    check_replaceable(Path("new"), replace=True)  # a folder of its own is fine


def test_a_report_in_a_folder_that_takes_no_file_is_refused_before_the_work(
    tmp_path: Path,
) -> None:
    """sysfs, read-only here as in any container: `projection memory --json` computed for 10 s,
    then failed to write."""
    from primus.core.folders import not_a_file

    assert not_a_file(tmp_path / "report.json") is None
    assert not_a_file(tmp_path) == "it is a folder"
    assert not_a_file(Path("/sys/report.json")) is not None
    # `--json PIPE` (or /dev/null, as root) had the write's rename replace the FIFO with a
    # file: a FIFO or device is written into, as `>` writes it; a socket is refused
    pipe, read = tmp_path / "pipe", []
    os.mkfifo(pipe)
    reader = threading.Thread(target=lambda: read.append(pipe.read_text()))
    reader.start()
    assert not_a_file(pipe) is None
    write_json(pipe, {"a": 1})
    reader.join(10)
    assert json.loads(read[0]) == {"a": 1} and stat.S_ISFIFO(pipe.stat().st_mode)
    (tmp_path / "link").symlink_to(tmp_path / "target.json")  # written through, kept a link
    write_json(tmp_path / "link", {"b": 2})
    assert (tmp_path / "link").is_symlink()
    assert json.loads((tmp_path / "target.json").read_text()) == {"b": 2}
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock"))
        said = "it is not a regular file (a socket or a block device)"
        assert not_a_file(tmp_path / "sock") == said
        with pytest.raises(ConfigError, match=f"sock: {re.escape(said)}"):
            write_json(tmp_path / "sock", {})
