"""The errors Primus reports to users, and the did-you-mean helper they share."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """Where a config value came from: a file and line, the command line, the environment, a
    default, or a patch."""

    kind: str  # "file" | "cli" | "env" | "default" | "patch"
    file: str | None = None
    line: int | None = None
    detail: str | None = None  # the env var name, the CLI token, or the patch id

    def __str__(self) -> str:
        path = self.file or ""
        if path:
            rel = os.path.relpath(path)
            path = path if rel.startswith("..") else rel
        where = f"{path}:{self.line}" if path and self.line else path
        if self.kind == "file":
            return where
        if self.kind == "env":
            return f"env {self.detail}" + (f" (at {where})" if where else "")
        if self.kind == "patch":
            return f"patch {self.detail}"
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


class PrimusError(Exception):
    """Base of every error Primus reports without a traceback. Exit code 1."""

    exit_code = 1
    label = "error"  # how the CLI introduces the message

    def __init__(self, message: str, origin: Origin | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.origin = origin
        self.hint = hint

    def __str__(self) -> str:
        text = (
            f"{self.origin}: {self.message}" if self.origin and str(self.origin) else self.message
        )
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class ConfigError(PrimusError):
    """Bad input: a config file, an override, a flag. Exit code 2."""

    exit_code = 2


class BackendError(ConfigError):
    """A backend that is unknown, failed to load, or whose upstream is missing or incompatible."""

    exit_code = 2


class PatchError(PrimusError):
    """A patch that failed to register or to apply."""


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean: a, b?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    return f" (did you mean: {', '.join(close)}?)" if close else ""
