"""Running patches for one phase, and the report of what happened to each."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, PatchError
from primus.core.logging import get_logger
from primus.core.patches.patch import Patch, PatchContext, PatchEffects
from primus.core.patches.registry import all_patches
from primus.core.patches.selection import PatchSelection
from primus.core.reliability.atomic import write_json

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
    params_set: list[dict[str, Any]] = field(default_factory=list)
    replaced: list[dict[str, Any]] = field(default_factory=list)  # target, sites

    def record(self, effects: PatchEffects) -> None:
        self.params_set = [change.as_dict() for change in effects.params]
        self.replaced = [{"target": r.target, "sites": r.sites} for r in effects.replaced]

    @property
    def changes(self) -> str:
        """`set a=1, b=2; replaced x (3 sites)`, or ''."""
        parts = []
        if self.params_set:
            parts.append("set " + ", ".join(f"{p['key']}={p['value']!r}" for p in self.params_set))
        parts += [f"replaced {r['target']} ({len(r['sites'])} sites)" for r in self.replaced]
        return "; ".join(parts)


class PatchRunner:
    """Runs a backend's patches phase by phase and records an outcome for each one.

    `on_error="fail"`: a patch (or its condition) that raises stops the run with a PatchError
    naming the patch, its file and the cause. `"warn"`: it is logged and the run goes on.
    A ConfigError is bad input, not a failing patch: it stops the run as it is (exit 2).
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
        self._check_requires()

    def _check_requires(self) -> None:
        order = [p.id for p in self.patches]
        for i, patch in enumerate(self.patches):
            if patch.requires is None:
                continue
            if patch.requires not in order[:i]:
                where = (
                    "is not a patch of this backend"
                    if patch.requires not in order
                    else "runs after it"
                )
                raise PatchError(
                    f"patch '{patch.id}' ({patch.location}) requires '{patch.requires}', which {where}",
                    hint="requires= names a patch of the same backend in an earlier phase or priority",
                )

    def skip_reason(self, patch: Patch, ctx: PatchContext) -> str | None:
        """Why `patch` will not run in `ctx`, or None. Raises what the condition raises."""
        if not self.selection.allows(patch.id):
            return f"filtered by {self.selection.source}"
        mismatch = patch.version_mismatch(ctx.backend_version)
        if mismatch:
            return mismatch
        if patch.requires is not None:
            done = self.outcomes[patch.requires]
            if done.status != APPLIED:
                return f"requires {patch.requires}, which {'did not run' if done.status == NOT_RUN else 'was ' + done.status}"
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
                    with ctx.running(patch.id) as effects:
                        try:
                            declined = patch.handler(ctx)  # a str: nothing to do, and why
                        finally:
                            outcome.record(effects)
                    reason = declined if isinstance(declined, str) else None
            except ConfigError as exc:  # the patch found the config wrong: bad input, exit 2
                outcome.status, outcome.reason = FAILED, f"ConfigError: {exc}"
                outcome.seconds = time.perf_counter() - start
                raise
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
                said = "; ".join(t for t in (done.reason, done.changes) if t)
                rows.append((patch, f"{done.status}: {said}" if said else done.status))
                continue
            try:
                reason = self.skip_reason(
                    patch,
                    dataclasses.replace(
                        ctx, phase=patch.phase, params=ctx.tree.data, config_tree=ctx.tree
                    ),
                )
            except Exception as exc:
                reason = f"condition raised {type(exc).__name__}: {exc}"
            rows.append((patch, f"would skip: {reason}" if reason else "will apply"))
        return rows

    def static_plan(self, backend_version: str | None) -> list[tuple[Patch, str]]:
        """Each patch with what is known before any phase runs, its condition not evaluated
        (a condition may import the upstream): filtered out, outside its version range, or
        when it applies."""
        rows = []
        for patch in self.patches:
            if not self.selection.allows(patch.id):
                rows.append((patch, f"would skip: filtered by {self.selection.source}"))
            elif mismatch := patch.version_mismatch(backend_version):
                rows.append((patch, f"would skip: {mismatch}"))
            else:
                when = [f"if {patch.condition_text}"] if patch.condition is not None else []
                when += [f"after {patch.requires} applies"] if patch.requires else []
                rows.append((patch, "applies " + ", ".join(when) if when else "will apply"))
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
        write_json(path, self.report(), default=str)

    def table(self) -> str:
        rows = [
            (o.id, o.phase, o.status, "; ".join(t for t in (o.reason, o.changes) if t))
            for o in self.outcomes.values()
        ]
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
