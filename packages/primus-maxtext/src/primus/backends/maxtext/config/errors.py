"""MaxText's config errors reach Primus, which reports them at the key's file:line."""

from __future__ import annotations

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, register_patch


def _raise(exc: Exception) -> None:
    """pyconfig's error handler, made to raise the error it is given."""
    raise exc


@register_patch(
    "maxtext.config_errors",
    backend="maxtext",
    phase="setup",
    backend_versions=TESTED,
    target="maxtext.configs.pyconfig._handle_config_exception",
    tags=("config",),
)
def config_errors(ctx: PatchContext) -> None:
    """pyconfig raises its config errors instead of logging a banner, writing
    /dev/termination-log and exiting with code 2 (what it does outside pytest), so Primus
    reports them as config errors at the key's file:line."""
    ctx.replace("maxtext.configs.pyconfig", "_handle_config_exception", _raise)
