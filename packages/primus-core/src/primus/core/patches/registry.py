"""`register_patch` and the registry it fills; patch modules come from entry points."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import importlib_metadata
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from primus.core.errors import PatchError
from primus.core.patches.patch import PHASES, TESTED, Patch, PatchContext

PATCHES_GROUP = "primus.patches"
_patches: dict[str, Patch] = {}
_seq = itertools.count()


def register_patch(
    patch_id: str,
    *,
    backend: str,
    phase: str,
    description: str | None = None,
    condition: Callable[[PatchContext], bool] | None = None,
    priority: int = 50,
    backend_versions: str | None = None,
    tags: Iterable[str] = (),
    target: str | None = None,
    requires: str | None = None,
) -> Callable[[Callable[[PatchContext], Any]], Callable[[PatchContext], Any]]:
    """Register the decorated `handler(ctx)` as a patch. Checked here, not at first use.

    A handler that finds nothing to do returns a string saying why (reported as skipped).

    Lower `priority` runs first; equal priorities run in registration order.
    `backend_versions` is a PEP 440 specifier set ("<0.20,>=0.17"), or TESTED: the backend
    adapter's `tested_versions` (the gate of a patch touching private upstream names); `target` names the
    upstream symbol replaced or wrapped ("someframework.training.initialize.compile_helpers").
    `requires` names a patch this one builds on: it runs only if that one applied.
    """

    def decorate(handler: Callable[[PatchContext], Any]) -> Callable[[PatchContext], Any]:
        where = f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"
        if not isinstance(patch_id, str) or not patch_id.strip():
            raise PatchError(f"patch at {where}: the id must be a non-empty string")
        if patch_id in _patches:
            raise PatchError(
                f"duplicate patch id '{patch_id}': registered by "
                f"{_patches[patch_id].module} and again by {handler.__module__}"
            )
        if phase not in PHASES:
            raise PatchError(
                f"patch '{patch_id}': unknown phase '{phase}' (one of {', '.join(PHASES)})"
            )
        if not isinstance(backend, str) or not backend:
            raise PatchError(f"patch '{patch_id}': backend must be a backend name")
        if not callable(handler) or (condition is not None and not callable(condition)):
            raise PatchError(f"patch '{patch_id}': the handler and condition must be callable")
        try:
            if backend_versions and backend_versions != TESTED:
                SpecifierSet(backend_versions)
        except InvalidSpecifier:
            raise PatchError(
                f"patch '{patch_id}': backend_versions '{backend_versions}' "
                "is not a PEP 440 specifier set"
            ) from None
        if requires is not None and (not isinstance(requires, str) or requires == patch_id):
            raise PatchError(f"patch '{patch_id}': requires must name another patch's id")
        text = description or (handler.__doc__ or "").strip().split("\n\n")[0].strip()
        if not text:
            raise PatchError(f"patch '{patch_id}': give a description or a docstring")
        _patches[patch_id] = Patch(
            patch_id,
            backend,
            phase,
            handler,
            " ".join(text.split()),
            condition,
            priority,
            backend_versions or None,
            tuple(tags),
            target,
            next(_seq),
            requires,
        )
        return handler

    return decorate


def all_patches(backend: str | None = None) -> list[Patch]:
    """Registered patches in run order (priority, then registration), optionally of one backend."""
    chosen = [p for p in _patches.values() if backend is None or p.backend == backend]
    return sorted(chosen, key=lambda p: (PHASES.index(p.phase), p.priority, p.seq))


def get_patch(patch_id: str) -> Patch | None:
    return _patches.get(patch_id)


@dataclass(frozen=True)
class PatchModuleFailure:
    entry_point: str
    distribution: str | None
    error: str
    exception: BaseException


_load_failures: list[PatchModuleFailure] | None = None


def load_patch_modules() -> list[PatchModuleFailure]:
    """Import every `primus.patches` module once; return the ones that failed to import."""
    global _load_failures
    if _load_failures is None:
        _load_failures = []
        for ep in importlib_metadata.entry_points(group=PATCHES_GROUP):
            try:
                ep.load()
            except Exception as exc:  # one broken plugin must not break the others
                _load_failures.append(
                    PatchModuleFailure(
                        f"{ep.name} = {ep.value}",
                        ep.dist.name if ep.dist else None,
                        f"{type(exc).__name__}: {exc}",
                        exc,
                    )
                )
    return _load_failures
