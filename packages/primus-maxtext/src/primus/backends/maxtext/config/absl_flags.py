"""absl's flags marked parsed, as MaxText's own entry point (absl's `app.run`) leaves them:
grain reads its flags when it starts worker processes (`grain_worker_count` > 0), and raised
`UnparsedFlagAccessError` under Primus, which parses no command line through absl."""

from __future__ import annotations

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.patches import PatchContext, register_patch


@register_patch(
    "maxtext.absl_flags",
    backend="maxtext",
    phase="setup",
    backend_versions=TESTED,
    target="absl.flags.FLAGS (parsed, with their defaults)",
    tags=("portability",),
)
def mark_flags_parsed(ctx: PatchContext) -> None:
    """Every absl flag takes its default, as after `app.run` with no flags on the command line."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
