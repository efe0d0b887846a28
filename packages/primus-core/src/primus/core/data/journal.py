"""The files of a `primus data prepare` run: PREFIX.bin.partial and PREFIX.sizes.partial, which
grow chunk by chunk, the journal PREFIX.journal that says how far they are good, a lock, and
the final PREFIX.bin, PREFIX.idx and PREFIX.json renamed into place at the end."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from primus.core.errors import ConfigError


@dataclass
class Counts:
    """Documents written, empty documents skipped, tokens and input bytes, so far."""

    documents: int = 0
    empty: int = 0
    tokens: int = 0
    bytes: int = 0


class Output:
    """The files of a run: the partial ones and the journal, then the final ones."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.bin, self.idx, self.json = (Path(f"{prefix}.{s}") for s in ("bin", "idx", "json"))
        self.partial_bin = Path(f"{prefix}.bin.partial")
        self.partial_sizes = Path(f"{prefix}.sizes.partial")
        self.partial_idx = Path(f"{prefix}.idx.partial")
        self.partial_json = Path(f"{prefix}.json.partial")
        self.journal = Path(f"{prefix}.journal")
        self.lock_file = Path(f"{prefix}.lock")
        self._lock: TextIO | None = None

    def partial(self) -> list[Path]:
        """The files of a run not finished."""
        return [self.partial_bin, self.partial_sizes, self.partial_idx, self.partial_json,
                self.journal]  # fmt: skip

    def all(self) -> list[Path]:
        return [self.bin, self.idx, self.json, *self.partial(), self.lock_file]

    def lock(self) -> None:
        """Hold PREFIX.lock (a killed run's lock goes with it): two runs on one prefix would
        write the same partial files."""
        import fcntl

        self._lock = self.lock_file.open("a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise ConfigError(
                f"{self.prefix} is being prepared by another command (it holds {self.lock_file})"
            ) from None

    def unlock(self) -> None:
        if self._lock is not None:
            self.lock_file.unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def resume(self, fingerprint: str) -> tuple[int, Counts, str | None]:
        """Chunks done, their counts, and why partial output is dropped (None: nothing to
        drop, or continued). Leaves the partial files cut to the last chunk journaled."""
        try:
            lines = self.journal.read_text().splitlines()
            ours = json.loads(lines[0]).get("fingerprint") == fingerprint
        except (OSError, IndexError, ValueError, AttributeError):
            lines, ours = [], True  # no journal (or not one of ours): nothing to continue
        done, counts, positions, note = 0, Counts(), (0, 0), None
        if not ours:
            note = "partial output of another command (other input, tokenizer or options)"
            lines = []
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:  # the line being written when the run was killed
                break
            done, positions = entry["chunk"] + 1, (entry["bin"], entry["sizes"])
            counts = Counts(**entry["counts"])
        files = (self.partial_bin, self.partial_sizes)
        sizes = [p.stat().st_size if p.exists() else -1 for p in files]
        if done and any(size < want for size, want in zip(sizes, positions, strict=True)):
            note = "partial output shorter than its journal"
            done, counts, positions = 0, Counts(), (0, 0)
        if not done:
            self.journal.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        for path, size in zip(files, positions, strict=True):
            with path.open("ab") as f:
                f.truncate(size)
        return done, counts, note

    def discard(self) -> None:
        for path in self.partial():
            path.unlink(missing_ok=True)

    def finish(self) -> None:
        """Rename the finished files into place: the old index and manifest go first."""
        self.idx.unlink(missing_ok=True)
        self.json.unlink(missing_ok=True)
        os.replace(self.partial_bin, self.bin)
        os.replace(self.partial_idx, self.idx)
        os.replace(self.partial_json, self.json)
        self.partial_sizes.unlink()
        self.journal.unlink()
