"""A patch, the context it sees, and the phases it may run in."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from primus.core.config.tree import ConfigTree
from primus.core.errors import PatchError
from primus.core.logging import get_logger, log_rank_0
from primus.core.patches import rebind
from primus.core.patches.params import USER_KINDS, ParamSet, ParamsView, set_param
from primus.core.patches.rebind import Replacement

PHASES = ("setup", "build_args", "before_train", "after_train")
# `backend_versions=TESTED`: the backend adapter's `tested_versions`, kept in one place.
TESTED = "tested"


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
class PatchEffects:
    """What one patch changed: params it set and names it replaced."""

    params: list[ParamSet] = field(default_factory=list)
    replaced: list[Replacement] = field(default_factory=list)


@dataclass
class PatchContext:
    """What a patch (and its condition) sees.

    `params` is read-only: a patch changes a param with `set_param` and an upstream name with
    `replace` / `wrap`, so every change has the patch as its origin and is in the report.
    `config_tree` is the module's ConfigTree that `set_param` writes to (default: one over
    `params`, which shares the dict).
    """

    backend: str
    phase: str
    backend_version: str | None
    primus_version: str
    params: Mapping[str, Any]
    backend_args: Any = None
    run_dir: Path | None = None
    stage: str = "pretrain"
    extra: dict[str, Any] = field(default_factory=dict)
    patch_id: str | None = None  # the patch running now (set by the runner)
    effects: PatchEffects = field(default_factory=PatchEffects)
    config_tree: InitVar[ConfigTree | None] = None

    def __post_init__(self, config_tree: ConfigTree | None) -> None:
        params = self.params if isinstance(self.params, dict) else dict(self.params)
        self.tree = config_tree if config_tree is not None else ConfigTree(params)
        self.params = ParamsView(self.tree.data, lambda: self.patch_id)

    @contextmanager
    def running(self, patch_id: str) -> Iterator[PatchEffects]:
        """Attribute what happens inside to `patch_id`."""
        self.patch_id, self.effects = patch_id, PatchEffects()
        try:
            yield self.effects
        finally:
            self.patch_id = None

    def _patch(self, what: str) -> str:
        if self.patch_id is None:
            raise PatchError(f"ctx.{what} is for patches: call it from a handler the runtime runs")
        return self.patch_id

    def set_param(self, key: str, value: Any, reason: str) -> None:
        """Set the param `key` (dotted) to `value`, with origin `patch <id>`; `reason` is logged
        and reported. Replacing a value the user chose is a warning."""
        change = set_param(self.tree, key, value, reason, self._patch("set_param"))
        if change is None:
            return
        self.effects.params.append(change)
        was = change.was_from
        if was is not None and was.kind in USER_KINDS and change.was != value:
            get_logger().warning(f"[{self.patch_id}] {key}: {change.was!r} -> {value!r}: {reason}")
        else:
            log_rank_0(f"[{self.patch_id}] {key}={value!r}: {reason}")

    def replace(self, owner: Any, name: str, new: Any, *, within: str | None = None) -> list[str]:
        """Replace `owner.name` (owner: module, class or dotted path) by `new`, in the owner
        and every copy under package `within` (default: the owner's top package). Returns
        the sites rebound; [] when this patch replaced it before (a different `new` then takes
        the earlier one's place at the same sites)."""
        record, sites = rebind.replace(
            owner, name, new, patch_id=self._patch("replace"), within=within
        )
        self.effects.replaced.append(record)
        return sites

    def original(self, owner: Any, name: str) -> Any:
        """`owner.name` as upstream had it, before this patch replaced it (decide from this,
        not from the replaced value, so that applying again decides the same)."""
        return rebind.original(owner, name, self._patch("original"))

    def wrap(
        self,
        owner: Any,
        name: str,
        wrapper: Callable[[Any], Any],
        *,
        within: str | None = None,
    ) -> list[str]:
        """`replace(owner, name, wrapper(original))`. Applied again, a fresh wrapper of the
        original takes the earlier one's place (a second run in one process gets its own)."""
        record, sites = rebind.wrap(
            owner, name, wrapper, patch_id=self._patch("wrap"), within=within
        )
        self.effects.replaced.append(record)
        return sites


_MISSING = object()


def get_param(ctx: PatchContext, dotted: str, default: Any = None) -> Any:
    """A resolved param by dotted key (`get_param(ctx, "turbo.enable", False)`)."""
    node: Any = ctx.params
    for key in dotted.split("."):
        node = node.get(key, _MISSING) if isinstance(node, Mapping) else _MISSING
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
    versions: str | None = None  # a specifier set, or TESTED
    tags: tuple[str, ...] = ()
    target: str | None = None
    seq: int = 0
    requires: str | None = None  # the id of a patch that must have applied first

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

    @property
    def backend_versions(self) -> SpecifierSet | None:
        """The version gate; TESTED reads the backend adapter's `tested_versions`."""
        if self.versions != TESTED:
            return SpecifierSet(self.versions) if self.versions else None
        from primus.core.backend.backend_registry import BackendRegistry
        from primus.core.errors import BackendError

        try:
            tested = BackendRegistry.get_adapter_class(self.backend, require_ready=False)
        except BackendError:
            return None
        return SpecifierSet(tested.tested_versions) if tested.tested_versions else None

    @property
    def gate_text(self) -> str:
        gate = self.backend_versions
        if gate is None and self.versions == TESTED:
            return f"{self.backend}'s tested range (backend not installed)"
        return str(gate or "any")

    def version_mismatch(self, version: str | None) -> str | None:
        """Why the version gate rejects `version`, or None when the patch may run."""
        if self.backend_versions is None:
            if self.versions == TESTED:
                return f"version mismatch: backend {self.backend} declares no tested_versions"
            return None
        if version is None:
            return f"version mismatch: upstream version unknown (needs {self.backend_versions})"
        try:
            ok = self.backend_versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            ok = False
        return None if ok else f"version mismatch: {version} not in {self.backend_versions}"
