"""Golden loss curves (primus.testing.golden): the comparison fails on a moved curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus.testing.golden import UPDATE_ENV, Tolerance, assert_matches_golden, curve_diff

CURVE = {step: 10.0 - 0.25 * step for step in range(1, 21)}
TOLERANCE = Tolerance(rtol=1e-5, atol=0.0, why="test")


def check(curve: dict[int, float], path: Path) -> None:
    assert_matches_golden(
        curve, path, recipe="tiny.yaml", seed=1234, tolerance=TOLERANCE, packages=("pytest",)
    )


@pytest.fixture
def golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "golden" / "tiny.json"
    monkeypatch.setenv(UPDATE_ENV, "1")
    check(CURVE, path)
    monkeypatch.delenv(UPDATE_ENV)
    return path


def test_recording_states_what_the_curve_was_recorded_with(golden: Path) -> None:
    record = json.loads(golden.read_text())
    assert record["recipe"] == "tiny.yaml" and record["seed"] == 1234
    assert record["steps"] == [1, 20]
    assert record["tolerance"] == {"rtol": 1e-5, "atol": 0.0, "why": "test"}
    assert record["versions"]["pytest"] == pytest.__version__
    assert record["losses"]["20"] == 5.0


def test_the_same_curve_passes_and_noise_within_tolerance_too(golden: Path) -> None:
    check(CURVE, golden)
    check({step: loss * (1 + 5e-6) for step, loss in CURVE.items()}, golden)


def test_a_moved_curve_fails_naming_the_steps_that_moved(golden: Path) -> None:
    moved = CURVE | {7: CURVE[7] * (1 + 1e-4), 12: CURVE[12] + 0.5}
    with pytest.raises(AssertionError) as failure:
        check(moved, golden)
    message = str(failure.value)
    assert "moved beyond rtol=1e-05 atol=0.0" in message and "(2 of 20 steps)" in message
    assert "step 7: got" in message and "step 12: got 7.5, golden 7.0" in message
    assert "step 8" not in message
    assert f"{UPDATE_ENV}=1" in message  # how to update it on purpose


def test_missing_extra_and_non_finite_steps_fail() -> None:
    golden = {1: 2.0, 2: 1.0}
    assert curve_diff({1: 2.0, 3: 0.5}, golden, 1e-5, 0.0) == [
        "step 2: missing (golden 1.0)",
        "step 3: not in the golden curve (got 0.5)",
    ]
    assert curve_diff({1: float("nan"), 2: 1.0}, golden, 1e-5, 1.0)[0].startswith("step 1: got nan")


def test_no_golden_file_or_another_tolerance_fails_instead_of_recording(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=f"no golden curve .* {UPDATE_ENV}=1"):
        check(CURVE, tmp_path / "absent.json")
    assert not (tmp_path / "absent.json").exists()
    path = tmp_path / "loose.json"
    path.write_text(json.dumps({"tolerance": {"rtol": 1e-2, "atol": 0.0}, "losses": {}}))
    with pytest.raises(AssertionError, match="recorded with tolerance"):
        check(CURVE, path)


def test_update_needs_the_variable_set_to_a_yes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPDATE_ENV, "0")
    with pytest.raises(AssertionError, match="no golden curve"):
        check(CURVE, tmp_path / "absent.json")
