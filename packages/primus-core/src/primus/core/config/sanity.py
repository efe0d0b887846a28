"""Values an upstream takes but that make no sense, refused at validation, the same way on
every backend.

A backend declares which of its keys keep which rule (`{"lr": LEARNING_RATE, ...}`) and calls
`ModuleConfig.require(rules)` before it builds its upstream's config: a value set (in a file,
an override) that breaks its key's rule is a ConfigError at the line that set it, naming the
key and what it must be. A key left unset keeps the upstream's default, unchecked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """What a key's value must be: `what` completes "KEY must be ..."; `null` is accepted
    only where `nullable` (it means the upstream's default). `refuses` gives values it refuses
    (the tests' bad-input corpus sets each key to them)."""

    what: str
    accepts: Callable[[Any], bool]
    nullable: bool = True
    refuses: tuple[Any, ...] = ()

    def problem(self, key: str, value: Any) -> str | None:
        """Why `value` breaks this rule for `key`, or None."""
        if value is None and self.nullable:
            return None
        if value is not None and self.accepts(value):
            return None
        return f"{key} must be {self.what}, got {'null' if value is None else repr(value)}"


def is_number(value: Any) -> bool:
    """A finite int or float (never a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fraction(value: Any) -> bool:
    return is_number(value) and 0 <= value < 1


POSITIVE = Rule("a positive number", lambda v: is_number(v) and v > 0, refuses=(0,))
"""Sizes, counts, steps and intervals: 0 or a negative value fails only later, or trains
nothing (a batch, a sequence length, train steps, a log or save interval)."""

NON_NEGATIVE = Rule(
    "a finite number of 0 or more", lambda v: is_number(v) and v >= 0, refuses=(-1,)
)
"""An epsilon, a weight decay: 0 turns it off, a negative value makes no sense."""

LEARNING_RATE = Rule(NON_NEGATIVE.what, NON_NEGATIVE.accepts, nullable=False, refuses=(-4.0, None))
"""A learning rate: never negative, never null (no upstream trains without one)."""

FRACTION = Rule("a number in [0, 1)", _fraction, refuses=(1.0,))
"""A decay factor such as one of Adam's betas."""

FRACTION_PAIR = Rule(
    "two numbers in [0, 1)",
    lambda v: isinstance(v, list | tuple) and len(v) == 2 and all(map(_fraction, v)),
    refuses=([0.9, 1.5], [[1], "fuzz", 3]),
)
"""A pair of decay factors, such as Adam's betas in one list."""

UNIT = Rule("a number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1, refuses=(1.5, -0.5))
"""A probability (a dropout) or a share (of the schedule, of the learning rate)."""


def positive_or_minus_one(meaning: str) -> Rule:
    """A size an upstream also takes as -1, with `meaning` ("the rest"); any other value below
    1 fails."""
    return Rule(f"a positive number, or -1 ({meaning})",
                lambda v: is_number(v) and (v > 0 or v == -1), refuses=(0, -2))  # fmt: skip


Rules = dict[str, Rule]  # dotted param key -> the rule its value keeps
