"""Golden loss curves: a run's per-step losses against a committed JSON file.

A golden file records the curve of one recipe with what it was recorded under (recipe, seed,
steps, tolerance, package versions). `assert_matches_golden` fails when any step moved beyond
the tolerance, listing the steps that moved. To change a curve on purpose, run the test with
PRIMUS_UPDATE_GOLDEN=1: the file is rewritten from the run instead of compared (the test still
passes and says so); commit the file with the reason. Without the variable (CI) it only compares.
"""

from __future__ import annotations

import json
import math
import os
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from primus.core.reliability.atomic import write_json

UPDATE_ENV = "PRIMUS_UPDATE_GOLDEN"


class Tolerance(NamedTuple):
    """A step matches when |got - golden| <= atol + rtol * |golden|; `why` says why so loose."""

    rtol: float
    atol: float
    why: str


# Every backend's tiny CPU recipe in fp32, one process. Measured: two runs of each on the CI
# machine (2 cores) gave bit-identical losses.
CPU_FP32 = Tolerance(
    rtol=1e-5,
    atol=0.0,
    why="fp32 on CPU, one process: two runs on the CI machine gave bit-identical losses; 1e-5"
    " relative (the CPU fp32 tolerance of a resumed run) leaves room for reduction-order"
    " noise, not for a real change",
)


def updating() -> bool:
    """Whether PRIMUS_UPDATE_GOLDEN asks for golden files to be rewritten (1/true/yes)."""
    return os.environ.get(UPDATE_ENV, "").strip().lower() in ("1", "true", "yes")


def versions(*distributions: str) -> dict[str, str]:
    """Installed version of each distribution ("not installed" where absent)."""
    found = {}
    for name in distributions:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def curve_diff(
    curve: dict[int, float], golden: dict[int, float], rtol: float, atol: float
) -> list[str]:
    """One line per step that differs: missing, extra, non-finite, or moved beyond
    |got - golden| <= atol + rtol * |golden|. Empty when the curves match."""
    lines = []
    for step in sorted(set(curve) | set(golden)):
        if step not in curve:
            lines.append(f"step {step}: missing (golden {golden[step]!r})")
        elif step not in golden:
            lines.append(f"step {step}: not in the golden curve (got {curve[step]!r})")
        else:
            got, want = curve[step], golden[step]
            diff = abs(got - want)
            if not math.isfinite(got) or diff > atol + rtol * abs(want):
                rel = diff / abs(want) if want else math.inf
                lines.append(
                    f"step {step}: got {got!r}, golden {want!r} (abs {diff:.3g}, rel {rel:.3g})"
                )
    return lines


def load(path: Path) -> tuple[dict[int, float], dict[str, Any]]:
    """(step -> loss, the whole record) from a golden file."""
    record = json.loads(path.read_text())
    return {int(step): float(loss) for step, loss in record["losses"].items()}, record


def write(path: Path, curve: dict[int, float], record: dict[str, Any]) -> None:
    record = record | {"losses": {str(step): curve[step] for step in sorted(curve)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def assert_matches_golden(
    curve: dict[int, float],
    path: Path,
    *,
    recipe: str,
    seed: int,
    tolerance: Tolerance,
    packages: tuple[str, ...],
) -> None:
    """Assert `curve` (step -> loss) matches the golden file at `path` within `tolerance`.

    `recipe`, `seed` and `tolerance` are the test's statement and are written into the file with
    the versions of `packages`; the tolerance in the file must equal the test's. With
    PRIMUS_UPDATE_GOLDEN=1 the file is (re)written instead.
    """
    rtol, atol = tolerance.rtol, tolerance.atol
    record = {
        "recipe": recipe,
        "seed": seed,
        "steps": [min(curve), max(curve)] if curve else [],
        "tolerance": tolerance._asdict(),
        "versions": versions(*packages),
    }
    if updating():
        write(path, curve, record)
        print(f"golden curve written: {path} ({len(curve)} steps)")
        return
    regenerate = f"rerun this test with {UPDATE_ENV}=1 to record it on purpose"
    assert path.exists(), f"no golden curve at {path}: {regenerate}"
    golden, recorded = load(path)
    stated = recorded.get("tolerance", {})
    assert (stated.get("rtol"), stated.get("atol")) == (rtol, atol), (
        f"{path} was recorded with tolerance {stated}, the test states rtol={rtol} "
        f"atol={atol}: {regenerate}"
    )
    moved = curve_diff(curve, golden, rtol, atol)
    assert not moved, (
        f"loss curve of {recipe} moved beyond rtol={rtol} atol={atol} from {path} "
        f"({len(moved)} of {len(golden)} steps):\n  " + "\n  ".join(moved) + "\n"
        f"recorded with {recorded.get('versions')}, now {record['versions']}.\n"
        f"If the change is intended, {regenerate} and say why in the commit."
    )
