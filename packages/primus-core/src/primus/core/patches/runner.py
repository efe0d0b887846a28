"""Running patches for one phase, and the report of what happened to each."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from primus.core.errors import PatchError
from primus.core.logging import get_logger
from primus.core.patches.patch import Patch, PatchContext
from primus.core.patches.registry import all_patches
from primus.core.patches.selection import PatchSelection

APPLIED, SKIPPED, FAILED, NOT_RUN = "applied", "skipped", "failed", "not run"


@dataclass
class PatchOutcome:
    id: str
    phase: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    target: str | None = None
    location: str = ""


class PatchRunner:
    """Runs a backend's patches phase by phase and records an outcome for each one.

    `on_error="fail"`: a patch (or its condition) that raises stops the run with a PatchError
    naming the patch, its file and the cause. `"warn"`: it is logged and the run goes on.
    """

    def __init__(self, backend: str, selection: PatchSelection, on_error: str = "fail") -> None:
        self.backend = backend
        self.selection = selection
        self.on_error = on_error
        self.patches = all_patches(backend)
        self.outcomes = {
            p.id: PatchOutcome(
                p.id,
                p.phase,
                NOT_RUN,
                "the run stopped before this phase",
                target=p.target,
                location=p.location,
            )
            for p in self.patches
        }

    def skip_reason(self, patch: Patch, ctx: PatchContext) -> str | None:
        """Why `patch` will not run in `ctx`, or None. Raises what the condition raises."""
        if not self.selection.allows(patch.id):
            return f"filtered by {self.selection.source}"
        mismatch = patch.version_mismatch(ctx.backend_version)
        if mismatch:
            return mismatch
        if patch.condition is not None and not patch.condition(ctx):
            return f"condition false: {patch.condition_text}"
        return None

    def run(self, ctx: PatchContext) -> None:
        for patch in (p for p in self.patches if p.phase == ctx.phase):
            outcome = self.outcomes[patch.id]
            start = time.perf_counter()
            try:
                reason = self.skip_reason(patch, ctx)
                if reason is None:
                    declined = patch.handler(ctx)  # a str: it found nothing to do, and why
                    reason = declined if isinstance(declined, str) else None
            except Exception as exc:
                outcome.status, outcome.reason = FAILED, f"{type(exc).__name__}: {exc}"
                outcome.seconds = time.perf_counter() - start
                message = (
                    f"patch '{patch.id}' ({patch.location}) failed in phase "
                    f"{ctx.phase}: {type(exc).__name__}: {exc}"
                )
                if self.on_error != "warn":
                    raise PatchError(
                        message,
                        hint="set patches.on_error: warn to go on, "
                        f"or PRIMUS_PATCHES=-{patch.id} to turn it off",
                    ) from exc
                get_logger().warning(message)
                continue
            outcome.seconds = time.perf_counter() - start
            if reason is None:  # applied: say why, when a condition decided it
                outcome.status = APPLIED
                outcome.reason = patch.condition_text if patch.condition else ""
            else:
                outcome.status, outcome.reason = SKIPPED, reason

    def plan(self, ctx: PatchContext) -> list[tuple[Patch, str]]:
        """Each patch with what happened to it or, for phases still ahead, what would happen."""
        rows = []
        for patch in self.patches:
            done = self.outcomes[patch.id]
            if done.status != NOT_RUN:
                rows.append(
                    (patch, f"{done.status}: {done.reason}" if done.reason else done.status)
                )
                continue
            try:
                reason = self.skip_reason(patch, dataclasses.replace(ctx, phase=patch.phase))
            except Exception as exc:
                reason = f"condition raised {type(exc).__name__}: {exc}"
            rows.append((patch, f"would skip: {reason}" if reason else "will apply"))
        return rows

    def report(self) -> dict[str, Any]:
        rows = [asdict(o) for o in self.outcomes.values()]
        counts = {
            s: sum(r["status"] == s for r in rows) for s in (APPLIED, SKIPPED, FAILED, NOT_RUN)
        }
        return {
            "backend": self.backend,
            "selection": self.selection.source,
            "summary": counts,
            "patches": rows,
        }

    def write_report(self, path: Path) -> None:
        path.write_text(json.dumps(self.report(), indent=2) + "\n")

    def table(self) -> str:
        rows = [(o.id, o.phase, o.status, o.reason) for o in self.outcomes.values()]
        if not rows:
            return f"no patches registered for {self.backend}"
        widths = [
            max(len(r[i]) for r in [("patch", "phase", "status", "reason"), *rows])
            for i in range(3)
        ]
        lines = [f"{'patch':<{widths[0]}}  {'phase':<{widths[1]}}  {'status':<{widths[2]}}  reason"]
        lines += [
            f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows
        ]
        return "\n".join(lines)
