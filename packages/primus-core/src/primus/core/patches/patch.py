"""A patch, the context it sees, and the phases it may run in."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

PHASES = ("setup", "build_args", "before_train", "after_train")


def _balanced(text: str) -> str:
    """A lambda's text up to where its enclosing call closes (`lambda c: f(c)), x` -> `lambda c: f(c)`)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if depth < 0 or (depth == 0 and ch in ",\n"):
            return text[:i].strip()
    return text.strip()


def _condition_text(cond: Callable[..., Any] | None) -> str:
    """The condition as a reader needs it: its docstring, a lambda's source, or its name."""
    if cond is None:
        return "always"
    doc = inspect.getdoc(cond)
    if doc:
        return doc.splitlines()[0]
    if getattr(cond, "__name__", "") == "<lambda>":
        try:
            src = inspect.getsource(cond)
            return _balanced(src[src.index("lambda") :])
        except (OSError, ValueError):
            return "a lambda"
    return f"{getattr(cond, '__module__', '')}.{getattr(cond, '__qualname__', repr(cond))}"


@dataclass
class PatchContext:
    """What a patch (and its condition) sees."""

    backend: str
    phase: str
    backend_version: str | None
    primus_version: str
    params: dict[str, Any]
    backend_args: Any = None
    run_dir: Path | None = None
    stage: str = "pretrain"
    extra: dict[str, Any] = field(default_factory=dict)


_MISSING = object()


def get_param(ctx: PatchContext, dotted: str, default: Any = None) -> Any:
    """A resolved param by dotted key (`get_param(ctx, "turbo.enable", False)`)."""
    node: Any = ctx.params
    for key in dotted.split("."):
        node = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING:
            return default
    return node


def get_args(ctx: PatchContext) -> Any:
    """The backend args object (None before the build_args phase)."""
    return ctx.backend_args


@dataclass(frozen=True)
class Patch:
    id: str
    backend: str
    phase: str
    handler: Callable[[PatchContext], Any]
    description: str
    condition: Callable[[PatchContext], bool] | None = None
    priority: int = 50
    backend_versions: SpecifierSet | None = None
    tags: tuple[str, ...] = ()
    target: str | None = None
    seq: int = 0

    @property
    def location(self) -> str:
        """file:line of the handler, relative to the import root (`primus/backends/x/p.py:12`)."""
        fn = inspect.unwrap(self.handler)
        try:
            path, line = inspect.getsourcefile(fn) or "?", inspect.getsourcelines(fn)[1]
        except (OSError, TypeError):
            return getattr(fn, "__module__", "?")
        roots = [r for r in sys.path if r and path.startswith(r.rstrip("/") + "/")]
        return f"{path[len(max(roots, key=len).rstrip('/')) + 1 :] if roots else path}:{line}"

    @property
    def condition_text(self) -> str:
        return _condition_text(self.condition)

    @property
    def module(self) -> str:
        return getattr(self.handler, "__module__", "?")

    def version_mismatch(self, version: str | None) -> str | None:
        """Why the version gate rejects `version`, or None when the patch may run."""
        if self.backend_versions is None:
            return None
        if version is None:
            return f"version mismatch: upstream version unknown (needs {self.backend_versions})"
        try:
            ok = self.backend_versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            ok = False
        return None if ok else f"version mismatch: {version} not in {self.backend_versions}"
