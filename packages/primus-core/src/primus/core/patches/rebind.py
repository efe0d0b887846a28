"""Replacing an upstream name everywhere it is bound; the engine owns the re-patch guard.

`replace` sets `owner.name` and every copy of the original under package `within` (a
`from owner import name` copy, which rebinding `owner.name` alone would miss). A function or
class the owner defines is recognised by identity under any name; any other value (a str, a
module, an alias of another module's class) only where it is bound under the same name. Each replacement is recorded per (owner, name, patch), so
applying it again adds no second layer (a new replacement takes the old one's place), and
`restore_all` undoes them (tests).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MISSING: Any = object()


def resolve(owner: Any) -> Any:
    """A module or class, or the object a dotted path names (`"pkg.mod.Class"`)."""
    if not isinstance(owner, str):
        return owner
    parts = owner.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but an import inside it failed
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"no module in '{owner}'")


def describe(holder: Any, attr: str) -> str:
    """`module.attr` or `module.Class.attr`."""
    if inspect.isclass(holder):
        return f"{holder.__module__}.{holder.__qualname__}.{attr}"
    return f"{getattr(holder, '__name__', type(holder).__name__)}.{attr}"


@dataclass
class Replacement:
    """One name replaced by one patch: where, by what, and the bindings it changed."""

    patch_id: str
    owner: Any
    name: str
    original: Any  # as stored on the owner (a class's staticmethod stays one); _MISSING if absent
    previous: Any  # the value the copies held
    new: Any
    bindings: list[tuple[Any, str]] = field(default_factory=list)  # (holder, attr), owner last

    @property
    def target(self) -> str:
        return describe(self.owner, self.name)

    @property
    def sites(self) -> list[str]:
        return [describe(holder, attr) for holder, attr in self.bindings]


_active: dict[tuple[int, str, str], Replacement] = {}


def _bound(holder: Any, attr: str) -> Any:
    """What `holder` itself binds to `attr` (a class's own dict, not its bases)."""
    if inspect.isclass(holder):
        return vars(holder).get(attr, _MISSING)
    return getattr(holder, attr, _MISSING)


def _module_of(owner: Any) -> str:
    return owner.__name__ if inspect.ismodule(owner) else getattr(owner, "__module__", "")


def _copies(original: Any, owner: Any, name: str, within: str) -> list[tuple[Any, str]]:
    """(module, attr) of every module global under `within` bound to `original`: under any
    name when it is a function or class the owner defines, else under `name` only."""
    if original is _MISSING:
        return []
    any_name = (inspect.isroutine(original) or inspect.isclass(original)) and getattr(
        original, "__module__", None
    ) == _module_of(owner)
    found = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == within or mod_name.startswith(within + ".")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original and (attr == name or any_name):
                found.append((module, attr))
    return found


def _top_package(owner: Any) -> str:
    return (_module_of(owner) or "").split(".")[0]


def replace(
    owner: Any, name: str, new: Any, *, patch_id: str, within: str | None = None
) -> tuple[Replacement, list[str]]:
    """Replace `owner.name` by `new` for `patch_id`; the record and the sites newly rebound
    ([] when this patch's replacement is already in place)."""
    owner = resolve(owner)
    key = (id(owner), name, patch_id)
    if key in _active:  # applied before: put `new` where the earlier replacement is, if it differs
        record = _active[key]
        for holder, attr in record.bindings if record.new is not new else ():
            if _bound(holder, attr) is record.new:
                setattr(holder, attr, new)
        record.new = new
        return record, []
    current = getattr(owner, name, _MISSING)
    record = Replacement(patch_id, owner, name, _bound(owner, name), current, new)
    record.bindings = [
        b
        for b in _copies(current, owner, name, within or _top_package(owner))
        if b != (owner, name)
    ]
    for holder, attr in record.bindings:
        setattr(holder, attr, new)
    setattr(owner, name, new)
    record.bindings.append((owner, name))
    _active[key] = record
    return record, record.sites


def wrap(
    owner: Any,
    name: str,
    wrapper: Callable[[Any], Any],
    *,
    patch_id: str,
    within: str | None = None,
) -> tuple[Replacement, list[str]]:
    """Replace `owner.name` by `wrapper(original)`. Applied again (a second run in the same
    process), the new wrapper wraps upstream's original and takes the earlier one's place:
    never a wrapper of a wrapper, and never one that still holds the first run's state."""
    owner = resolve(owner)
    record = _active.get((id(owner), name, patch_id))
    base = record.previous if record else getattr(owner, name)
    return replace(owner, name, wrapper(base), patch_id=patch_id, within=within)


def original(owner: Any, name: str, patch_id: str) -> Any:
    """`owner.name` as it was before `patch_id` replaced it (its current value if it did not)."""
    owner = resolve(owner)
    record = _active.get((id(owner), name, patch_id))
    value = record.previous if record else getattr(owner, name)
    if value is _MISSING:
        raise AttributeError(f"{describe(owner, name)} did not exist before {patch_id}")
    return value


def active(patch_id: str | None = None) -> list[Replacement]:
    """The replacements in place, in the order they were made."""
    return [r for r in _active.values() if patch_id is None or r.patch_id == patch_id]


def restore_all(patch_id: str | None = None) -> list[str]:
    """Undo every replacement (or one patch's), newest first; returns the targets restored."""
    restored = []
    for key, record in reversed(list(_active.items())):
        if patch_id is not None and record.patch_id != patch_id:
            continue
        for holder, attr in record.bindings:
            if _bound(holder, attr) is not record.new:
                continue  # rebound since by someone else: leave theirs
            old = record.original if holder is record.owner else record.previous
            if old is _MISSING:  # absent, or inherited by a class: drop the override
                delattr(holder, attr)
            else:
                setattr(holder, attr, old)
        del _active[key]
        restored.append(record.target)
    return restored
