"""The params a patch sees (read-only) and `set_param`, the one way a patch changes them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.errors import Origin, PatchError

_MISSING: Any = object()
# Where a value a patch replaces came from, when the user (not a default) chose it.
USER_KINDS = ("file", "cli", "env")


class ParamsView(Mapping[str, Any]):
    """A read-only view of the params; nested mappings are views too. A write raises a
    PatchError naming the patch that tried it."""

    def __init__(self, data: Mapping[str, Any], writer: Callable[[], str | None]) -> None:
        self._data = data
        self._writer = writer

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return ParamsView(value, self._writer) if isinstance(value, Mapping) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ParamsView({self._data!r})"

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise PatchError(
            f"patch '{self._writer() or '?'}' writes ctx.params directly: params are read-only "
            "to patches",
            hint="use ctx.set_param(key, value, reason), which records the patch as the origin",
        )

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = _refuse


@dataclass(frozen=True)
class ParamSet:
    """A value a patch set, and what it replaced."""

    key: str
    value: Any
    reason: str
    was: Any = _MISSING
    was_from: Origin | None = None

    def as_dict(self) -> dict[str, Any]:
        entry = {"key": self.key, "value": self.value, "reason": self.reason}
        if self.was is not _MISSING:
            entry |= {"was": self.was, "was_from": str(self.was_from or "default")}
        return entry

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}"


def set_param(
    tree: ConfigTree, key: str, value: Any, reason: str, patch_id: str
) -> ParamSet | None:
    """Write `key` (dotted) into `tree` with origin `patch <patch_id>`; None when that value
    from that patch is already there (applying twice changes nothing)."""
    path = tuple(key.split("."))
    origin = Origin("patch", detail=patch_id)
    old = tree.get(path, _MISSING)
    if old == value and tree.origin(path) == origin:
        return None
    was_from = tree.origin(path) if old is not _MISSING else None
    tree.merge(single_value_tree(path, copy.deepcopy(value), origin))
    return ParamSet(
        key, value, reason, old, was_from or (Origin("default") if old is not _MISSING else None)
    )
