"""`max_skipped_steps` and SkippedSteps: the non-finite rule every backend's patch applies."""

from __future__ import annotations

import logging
import math

import pytest

from primus.core.errors import ConfigError
from primus.core.patches import PatchContext
from primus.core.reliability.nonfinite import DEFAULT_MAX_SKIPPED, NonFiniteError, SkippedSteps


def test_a_non_finite_step_is_skipped_and_logged_with_its_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = SkippedSteps(limit=3)
    assert guard.observe(1, {"loss": 2.0, "grad norm": 1.0})
    with caplog.at_level(logging.WARNING):
        assert not guard.observe(2, {"loss": math.nan, "grad norm": None})
    assert "step 2 skipped: loss is nan; 1 in a row (max_skipped_steps 3)" in caplog.text
    assert not guard.exhausted
    assert guard.observe(3, {"loss": 1.9, "grad norm": 0.9})  # a good step ends the streak
    assert guard.in_row == []


def test_the_limit_th_non_finite_step_in_a_row_stops_the_run() -> None:
    guard = SkippedSteps(limit=3)
    for step in (5, 6):
        assert not guard.observe(step, {"loss": 1.0, "grad norm": math.inf})
        assert not guard.exhausted
    assert not guard.observe(7, {"loss": -math.inf, "grad norm": math.nan})
    assert guard.exhausted
    error = guard.error("/run/checkpoints/iter_4")
    assert isinstance(error, NonFiniteError) and error.exit_code == 1
    assert str(error).startswith(
        "steps 5-7 non-finite (loss is -inf, grad norm is nan at step 7): 3 in a row, "
        "max_skipped_steps is 3; the last good state (before step 5) is in /run/checkpoints/iter_4"
    )


@pytest.mark.parametrize("limit", [0, 1])
def test_a_limit_of_0_or_1_stops_at_the_first(limit: int) -> None:
    guard = SkippedSteps(limit=limit)
    assert not guard.observe(9, {"loss": math.nan})
    assert guard.exhausted
    assert str(guard.error("ckpt")).startswith("step 9 non-finite (loss is nan at step 9)")


def test_the_limit_comes_from_max_skipped_steps_and_must_not_be_negative() -> None:
    def context(params: dict) -> PatchContext:
        return PatchContext("dummy", "before_train", None, "0", params)

    assert SkippedSteps.from_params(context({})).limit == DEFAULT_MAX_SKIPPED
    assert SkippedSteps.from_params(context({"max_skipped_steps": 0})).limit == 0
    with pytest.raises(ConfigError, match="max_skipped_steps must be 0 or more, got -2"):
        SkippedSteps.from_params(context({"max_skipped_steps": -2}))
