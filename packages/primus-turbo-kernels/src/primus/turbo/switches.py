"""The `turbo:` config section: `turbo.enable` plus one switch per feature.

Nothing changes until `turbo.enable: true`; then every feature a backend has is on unless its
own switch is false (`turbo: {enable: true, rope: false}`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from primus.core.config import ParamSpec, register_params
from primus.core.patches import PatchContext, get_param, register_patch

Handler = Callable[[PatchContext], Any]

ENABLE_HELP = "turn on Primus turbo kernels (default false); each feature then has its own switch"


def register_switches(backend: str, features: Mapping[str, str]) -> None:
    """Declare `turbo.enable` and `turbo.<feature>` (help text per feature) for a backend."""
    specs = {"turbo.enable": ParamSpec(bool, ENABLE_HELP, default=False)}
    for feature, what in features.items():
        specs[f"turbo.{feature}"] = ParamSpec(
            bool, f"{what} (default true once turbo.enable is true)", default=True
        )
    register_params(backend, specs)


def enabled(ctx: PatchContext, feature: str) -> bool:
    """Whether `feature` is on in this run's config."""
    return bool(get_param(ctx, "turbo.enable", False)) and bool(
        get_param(ctx, f"turbo.{feature}", True)
    )


def switch(feature: str) -> Callable[[PatchContext], bool]:
    """A patch condition for `feature`; its docstring is what `primus patches list` shows."""

    def condition(ctx: PatchContext) -> bool:
        return enabled(ctx, feature)

    condition.__name__ = condition.__qualname__ = f"turbo_{feature}_on"
    condition.__doc__ = f"turbo.enable and turbo.{feature} (default true) are true"
    return condition


def turbo_patch(
    backend: str,
    feature: str,
    target: str,
    backend_versions: str | None = None,
    phase: str = "build_args",
) -> Callable[[Handler], Handler]:
    """`register_patch` for one turbo feature: id `<backend>.turbo_<feature>`, its switch as
    the condition, phase `build_args` (before the trainer builds the model) unless the
    backend's own checks must see it (`setup`), tag `turbo`."""
    return register_patch(
        f"{backend}.turbo_{feature}",
        backend=backend,
        phase=phase,
        condition=switch(feature),
        backend_versions=backend_versions,
        target=target,
        tags=("turbo",),
    )
