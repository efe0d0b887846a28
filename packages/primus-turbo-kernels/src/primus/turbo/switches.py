"""The `turbo:` config section: `turbo.enable` plus one switch per feature.

`turbo.enable` is `auto` by default: on for a run on a GPU, off on the CPU (where Triton's
kernels only run through its interpreter); `true` or `false` decide either way. While it is on,
every feature a backend has is on unless its own switch is false (`turbo: {rope: false}`),
except the opt-in ones (`turbo.fp8`), on only where their switch is true.
Each run logs one line saying whether turbo is on, why, and which features.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from primus.core.config import ParamSpec, register_params
from primus.core.devices import wants_cpu
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_param, register_patch

Handler = Callable[[PatchContext], Any]

ENABLE_HELP = (
    "Primus turbo kernels: auto (default) turns them on for a run on a GPU and off on the "
    "CPU; true or false decides; each feature then has its own switch"
)


# Features that are off unless their switch is true (`turbo.fp8`: not bf16's numerics).
OPT_IN: set[str] = set()


def register_switches(
    backend: str,
    features: Mapping[str, str],
    opt_in: Mapping[str, str] | None = None,
    params: Mapping[str, ParamSpec] | None = None,
) -> None:
    """Declare `turbo.enable` and `turbo.<feature>` (help text per feature) for a backend, the
    `opt_in` features (default false), further `params`, and the patch that logs what turbo
    does in a run."""
    opt_in = dict(opt_in or {})
    OPT_IN.update(opt_in)
    specs = {
        "turbo.enable": ParamSpec((bool, str), ENABLE_HELP, choices=("auto", True, False),
                                  default="auto"),
    }  # fmt: skip
    for feature, what in features.items():
        specs[f"turbo.{feature}"] = ParamSpec(
            bool, f"{what} (default true while turbo is on)", default=True
        )
    for feature, what in opt_in.items():
        specs[f"turbo.{feature}"] = ParamSpec(
            bool, f"{what} (default false; true takes effect while turbo is on)", default=False
        )
    register_params(backend, {**specs, **(params or {})})
    features = {**features, **opt_in}

    @register_patch(
        f"{backend}.turbo",
        backend=backend,
        phase="setup",
        priority=0,
        target="the run's log: whether turbo kernels are on, why, and which",
        tags=("turbo",),
    )
    def turbo_status(ctx: PatchContext) -> None:
        """Log one line: turbo on (and its features) or off, and the switch that says so."""
        log_rank_0(f"[turbo] {status(ctx, features)}")


def turned_on(ctx: PatchContext) -> tuple[bool, str]:
    """Whether turbo is on in this run, and why."""
    enable = get_param(ctx, "turbo.enable", "auto")
    if enable != "auto":
        return bool(enable), f"turbo.enable is {str(enable).lower()}"
    if wants_cpu(ctx):
        return False, "the run is on the CPU (turbo.enable: auto; true runs the kernels there)"
    return True, "the run is on a GPU (turbo.enable: auto)"


def status(ctx: PatchContext, features: Mapping[str, str]) -> str:
    """The turbo line of a run's log."""
    on, why = turned_on(ctx)
    if not on:
        return f"off: {why}"
    chosen = [f for f in features if get_param(ctx, f"turbo.{f}", f not in OPT_IN)]
    dropped = [f"turbo.{f}: false" for f in features if f not in chosen and f not in OPT_IN]
    return (
        f"on: {why}: {', '.join(chosen) or 'no feature'}"
        + (f" ({', '.join(dropped)})" if dropped else "")
        + "; turbo.enable: false turns them off"
    )


def enabled(ctx: PatchContext, feature: str) -> bool:
    """Whether `feature` is on in this run."""
    return turned_on(ctx)[0] and bool(get_param(ctx, f"turbo.{feature}", feature not in OPT_IN))


def switch(feature: str) -> Callable[[PatchContext], bool]:
    """A patch condition for `feature`; its docstring is what `primus patches list` shows."""

    def condition(ctx: PatchContext) -> bool:
        return enabled(ctx, feature)

    condition.__name__ = condition.__qualname__ = f"turbo_{feature}_on"
    default = str(feature not in OPT_IN).lower()
    condition.__doc__ = (
        f"turbo.enable (default auto: true on a GPU) and turbo.{feature} (default {default}) "
        "are true"
    )
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
