"""Parameter schemas: what keys a backend accepts, their types, and the check against them.

A backend adapter describes its upstream's real key set (`BackendAdapter.param_schema`);
any distribution may add keys for a backend with `register_params` (patch switches, for one),
or for every backend with `register_params(ALL_BACKENDS, ...)` (core's own keys).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from primus.core.config.tree import ConfigTree
from primus.core.errors import ConfigError, clipped, did_you_mean

_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}


@dataclass(frozen=True)
class ParamSpec:
    """One accepted key. `type` None means any; `open` means a mapping with free-form keys;
    `nullable` False: the upstream takes no null for it (its type admits none)."""

    type: type | tuple[type, ...] | None = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    default: Any = None
    open: bool = False
    nullable: bool = True

    def type_error(self, value: Any) -> str | None:
        """Why `value` does not fit this spec, or None when it does."""
        if value is None:
            if self.nullable:
                return None
            known = f" (default: {self.default!r})" if self.default is not None else ""
            return f"cannot be null{known}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}"
        if self.type is None:
            return None
        wanted = self.type if isinstance(self.type, tuple) else (self.type,)
        if any(_fits(value, t) for t in wanted):
            return _out_of_range(value)
        names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in wanted)
        return f"must be {names}, got {type(value).__name__} {value!r}"


INT64 = 2**63  # no upstream takes an integer beyond 64 bits


def _out_of_range(value: Any) -> str | None:
    """Why a number no upstream can hold is refused: beyond 64 bits, or not finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -INT64 <= value < INT64:
        return f"an integer of {len(str(abs(value)))} digits is out of range (beyond 64 bits)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    return None


def _fits(value: Any, wanted: type) -> bool:
    if isinstance(value, bool):  # bool is an int in Python, but not in a config
        return wanted is bool
    if wanted is float:
        return isinstance(value, int | float)
    return isinstance(value, wanted)


class ParamSchema:
    """Dotted key -> ParamSpec, e.g. `"optimizer.lr": ParamSpec(float)`.

    `hints` maps spellings that are not keys (an upstream's flag names, say) to what to write.
    """

    def __init__(
        self, specs: Mapping[str, ParamSpec] | None = None, hints: Mapping[str, str] | None = None
    ) -> None:
        self.specs: dict[str, ParamSpec] = dict(specs or {})
        self.hints: dict[str, str] = dict(hints or {})

    def __contains__(self, key: str) -> bool:
        return key in self.specs

    def __len__(self) -> int:
        return len(self.specs)

    def merged(self, *others: ParamSchema) -> ParamSchema:
        specs, hints = dict(self.specs), dict(self.hints)
        for other in others:
            specs.update(other.specs)
            hints.update(other.hints)
        return ParamSchema(specs, hints)

    def _is_open(self, parts: tuple[str, ...]) -> bool:
        for i in range(1, len(parts)):
            spec = self.specs.get(".".join(parts[:i]))
            if spec is not None and (spec.open or spec.type is dict):
                return True
        return False

    def check(self, params: ConfigTree, what: str = "parameter") -> list[ConfigError]:
        """Every unknown key and wrongly typed value in `params`, each with its origin."""
        errors = []
        for path, value in params.leaves():
            key = ".".join(path)
            spec = self.specs.get(key)
            if spec is not None:
                problem = spec.type_error(value)
                if problem:
                    hint = f"remove {key} to keep its default" if value is None else None
                    errors.append(ConfigError(f"{key}: {problem}", params.origin(path), hint=hint))
            elif not self._is_open(path):
                inner = [k for k in self.specs if k.startswith(f"{key}.")]
                if inner and isinstance(value, dict):
                    continue  # an empty section that the schema knows
                if inner:  # `training=5` is no unknown key: a section given a value
                    keys = ", ".join(inner[:3]) + (", ..." if len(inner) > 3 else "")
                    shown = f"{type(value).__name__} {clipped(repr(value))}"
                    errors.append(ConfigError(f"{key}: must be a mapping (of {keys}), got "
                                              f"{shown}", params.origin(path)))  # fmt: skip
                    continue
                errors.append(
                    ConfigError(
                        f"unknown {what} '{clipped(key)}'{did_you_mean(key, self.specs)}",
                        params.origin(path),
                        hint=self.hints.get(key),
                    )
                )
        return errors


ALL_BACKENDS = "*"
_registered: dict[str, dict[str, ParamSpec]] = {}


def register_params(backend: str, specs: Mapping[str, ParamSpec]) -> None:
    """Declare keys that a backend (or `ALL_BACKENDS`) accepts besides its upstream's."""
    _registered.setdefault(backend, {}).update(specs)


def registered_params(backend: str) -> ParamSchema:
    """The keys registered for every backend, then for `backend` (which may refine them)."""
    return ParamSchema({**_registered.get(ALL_BACKENDS, {}), **_registered.get(backend, {})})


def raise_all(errors: Iterable[ConfigError]) -> None:
    """Raise one ConfigError listing every error (the first carries the origin)."""
    errors = list(errors)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        lines = "\n".join(f"  {e}" for e in errors)
        raise ConfigError(f"{len(errors)} config errors:\n{lines}")
