"""Non-finite numbers: a step whose loss or gradient norm is NaN or Inf is skipped before the
optimizer step (the weights keep their last good values) and logged with its step number; at the
`max_skipped_steps`-th such step in a row the run saves a checkpoint of the last good state and
stops with exit code 1 (docs/reliability.md). The key and the behaviour are the same on every
backend: each one's patch feeds its step's numbers to a `SkippedSteps`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from primus.core.config import ALL_BACKENDS, ParamSpec, register_params
from primus.core.errors import ConfigError, PrimusError
from primus.core.logging import get_logger
from primus.core.patches import PatchContext, get_param

DEFAULT_MAX_SKIPPED = 3

register_params(
    ALL_BACKENDS,
    {
        "max_skipped_steps": ParamSpec(
            int,
            "how many steps in a row may have a NaN/Inf loss or gradient norm: each is skipped, "
            "and the last of them stops the run with a checkpoint of the last good state "
            f"(0 or 1: stop at the first; default {DEFAULT_MAX_SKIPPED})",
            default=DEFAULT_MAX_SKIPPED,
        ),
    },
)


class NonFiniteError(PrimusError):
    """Too many non-finite steps in a row. Exit code 1."""


@dataclass
class SkippedSteps:
    """The run's count of non-finite steps in a row, against `limit` (max_skipped_steps)."""

    limit: int
    in_row: list[int] = field(default_factory=list)  # the step numbers of the current streak
    last_bad: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_params(cls, ctx: PatchContext) -> SkippedSteps:
        limit = get_param(ctx, "max_skipped_steps", DEFAULT_MAX_SKIPPED)
        if limit is None or limit < 0:
            raise ConfigError(
                f"max_skipped_steps must be 0 or more, got {limit}",
                ctx.tree.origin(("max_skipped_steps",)),
            )
        return cls(int(limit))

    def observe(self, step: int, values: Mapping[str, float | None]) -> bool:
        """Whether step `step` may update the weights: False, logged, when any of `values`
        (e.g. {"loss": ..., "grad norm": ...}; None is not looked at) is NaN or Inf."""
        bad = {k: v for k, v in values.items() if v is not None and not math.isfinite(v)}
        if not bad:
            self.in_row.clear()
            return True
        self.in_row.append(step)
        self.last_bad = bad
        get_logger().warning(
            f"step {step} skipped: {_describe(bad)}; {len(self.in_row)} in a row "
            f"(max_skipped_steps {self.limit})"
        )
        return False

    @property
    def exhausted(self) -> bool:
        """The streak has reached the limit: save the last good state, then raise `error()`."""
        return bool(self.in_row) and len(self.in_row) >= self.limit

    def error(self, checkpoint: str) -> NonFiniteError:
        first, last = self.in_row[0], self.in_row[-1]
        steps = f"step {last}" if first == last else f"steps {first}-{last}"
        return NonFiniteError(
            f"{steps} non-finite ({_describe(self.last_bad)} at step {last}): "
            f"{len(self.in_row)} in a row, max_skipped_steps is {self.limit}; the last good "
            f"state (before step {first}) is in {checkpoint}",
            hint="lower the learning rate or check the data around these steps; "
            "running the same command resumes from that checkpoint",
        )


def _describe(bad: Mapping[str, float]) -> str:
    return ", ".join(f"{name} is {value}" for name, value in bad.items())
