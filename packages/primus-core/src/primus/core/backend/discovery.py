"""Finding installed backends through the `primus.backends` entry point group.

Everything here reads distribution metadata; the only code imported is the adapter module
itself, which by contract does not import its upstream. A plugin that fails to load, or
whose upstream is missing or of the wrong version, is reported, never fatal to the others.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import importlib_metadata
from packaging.requirements import InvalidRequirement, Requirement

from primus.core.backend.capabilities import CAPABILITIES
from primus.core.backend.contract import contract_problem

BACKENDS_GROUP = "primus.backends"
READY, UPSTREAM_MISSING, INCOMPATIBLE, FAILED = (
    "ready",
    "upstream missing",
    "incompatible version",
    "failed to load",
)


@dataclass
class BackendInfo:
    """What is known about one backend before it is used."""

    name: str
    entry_point: str | None = None
    distribution: str | None = None
    version: str | None = None
    upstream_requirement: str | None = None
    upstream_version: str | None = None
    status: str = READY
    reason: str | None = None
    adapter_class: Any = field(default=None, repr=False)
    load_error: BaseException | None = field(default=None, repr=False)
    hint: str | None = None  # what to do about a failure to load, fitted to its cause

    @property
    def stages(self) -> list[str] | None:
        """The stages the adapter declares (None: it did not load)."""
        return None if self.adapter_class is None else list(self.adapter_class.trainers)

    @property
    def capabilities(self) -> list[str] | None:
        """The optional capabilities the adapter declares, in their canonical order."""
        if self.adapter_class is None:
            return None
        return [name for name in CAPABILITIES if name in self.adapter_class.capabilities]

    def as_dict(self) -> dict[str, Any]:
        keys = (
            "name",
            "distribution",
            "version",
            "upstream_requirement",
            "upstream_version",
            "status",
            "reason",
            "entry_point",
            "stages",
            "capabilities",
        )
        return {k: getattr(self, k) for k in keys}

    def install_hint(self) -> str | None:
        if self.status in (UPSTREAM_MISSING, INCOMPATIBLE) and self.upstream_requirement:
            return f'pip install "{self.upstream_requirement}"'
        if self.status == FAILED:
            return self.hint
        return None


def _where(exc: BaseException, package: str) -> str:
    """' at file:line' of the deepest traceback frame in `package` (or of a syntax error)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = [
        f
        for f, _ in traceback.walk_tb(exc.__traceback__)
        if str(f.f_globals.get("__name__", "")).startswith(package)
    ]
    return f" at {frames[-1].f_code.co_filename}:{frames[-1].f_lineno}" if frames else ""


def load_failure_hint(exc: BaseException, module: str, distribution: str | None) -> str:
    """What to do when the plugin module `module` raised `exc` on import.

    Its own module missing means a broken install; any other failure is in the plugin's
    code (an import of something not installed, or a bug), which reinstalling does not fix.
    """
    dist = distribution or "the plugin"
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and (module == missing or module.startswith(missing + ".")):
        return (
            f"{dist} is installed without its module {missing}: reinstall it "
            f"(pip install --force-reinstall {dist})"
        )
    where = _where(exc, module)
    if missing and missing.startswith("primus."):
        return (
            f"{dist}'s code imports {missing}{where}, which this primus-core does not have: "
            "fix the import (docs/writing-a-backend.md lists the public modules); "
            "--debug shows the traceback"
        )
    if missing:
        return (
            f"{dist}'s code imports {missing}{where}, which is not installed: install it or "
            "fix the import; --debug shows the traceback"
        )
    return (
        f"the error is in {dist}'s own code{where}, not in the install: fix the plugin; "
        "--debug shows the traceback"
    )


def upstream_requirement_of(dist: importlib_metadata.Distribution) -> str | None:
    """The requirement listed under the distribution's `upstream` extra, if any."""
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if (
            req.marker
            and req.marker.evaluate({"extra": "upstream"})
            and not req.marker.evaluate({"extra": ""})
        ):
            req.marker = None
            return str(req)
    return None


def check_upstream(info: BackendInfo) -> None:
    """Fill in the installed upstream version and the status it implies."""
    if not info.upstream_requirement or info.status == FAILED:
        return
    req = Requirement(info.upstream_requirement)
    try:
        info.upstream_version = importlib_metadata.version(req.name)
    except importlib_metadata.PackageNotFoundError:
        info.status, info.reason = UPSTREAM_MISSING, f"{req.name} is not installed"
        return
    if req.specifier and not req.specifier.contains(info.upstream_version, prereleases=True):
        info.status = INCOMPATIBLE
        info.reason = f"{req.name} {info.upstream_version} is installed; this backend needs {req}"


def discover_entry_points() -> dict[str, BackendInfo]:
    """Load every `primus.backends` entry point and check its upstream. Never raises."""
    found: dict[str, BackendInfo] = {}
    for ep in importlib_metadata.entry_points(group=BACKENDS_GROUP):
        dist = ep.dist
        info = BackendInfo(
            name=ep.name,
            entry_point=ep.value,
            distribution=dist.name if dist else None,
            version=dist.version if dist else None,
            upstream_requirement=upstream_requirement_of(dist) if dist else None,
        )
        if ep.name in found:
            other = found[ep.name].distribution
            info.status, info.reason = FAILED, f"the name '{ep.name}' is also claimed by {other}"
            found[f"{ep.name} ({info.distribution})"] = info
            continue
        try:
            adapter_cls = ep.load()
        except Exception as exc:  # a broken plugin is reported, not fatal
            info.status, info.reason = FAILED, f"{type(exc).__name__}: {exc}"
            info.load_error = exc
            info.hint = load_failure_hint(exc, ep.module, info.distribution)
        else:
            problem = contract_problem(adapter_cls)
            if problem:
                info.status, info.reason = FAILED, problem
            else:
                info.adapter_class = adapter_cls
        check_upstream(info)
        found[ep.name] = info
    return found
