"""MaxText logs through absl; its records go to Primus's logger (console and rank log)."""

from __future__ import annotations

import logging

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.logging import LogRouter
from primus.core.patches import PatchContext, register_patch


class _NoTorchNotice(logging.Filter):
    """Drops transformers' notice, when it is imported, that PyTorch was not found: the adapter
    hid torch on purpose (`unused_modules`; `--debug` says so)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found.")


_NO_TORCH_NOTICE = _NoTorchNotice()


@register_patch(
    "maxtext.logging",
    backend="maxtext",
    phase="setup",
    priority=1,
    backend_versions=TESTED,
    target="absl logger (maxtext.utils.max_logging), logging 'maxtext' logger",
    tags=("observability",),
)
def route_logs(ctx: PatchContext) -> None:
    """Send MaxText's INFO logs (step lines, checkpoints, config warnings) to Primus's logger;
    absl's verbosity becomes INFO, as MaxText's own entry point sets it. transformers' notice
    that torch is missing is dropped (MaxText has no use for torch)."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    # MaxText's own records from INFO, other libraries' (orbax, grain, ...) from WARNING
    router = LogRouter("maxtext", level=logging.WARNING, levels={"/maxtext/": logging.INFO})
    router.attach("absl", "maxtext")
    logging.getLogger("transformers").addFilter(_NO_TORCH_NOTICE)
