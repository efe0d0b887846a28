"""A resumed pretraining run reads the samples the run it continues would have read: the sample
order of a prepared corpus (or blend) depends on its corpora, sequence length, seed and the
epochs the schedule spans, and a resume whose order is not the checkpoint's is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError

ORDER_FILE = "data_order.json"  # a run directory's sample order, where no checkpoint keeps it


def _describe(order: dict[str, Any]) -> str:
    if "blend" in order:
        return "; ".join(f"{w:.3g} of {_describe(part)}" for w, part in order["blend"])
    epochs = f"{order['epochs']} epoch{'s' * (order['epochs'] != 1)}"
    apart = ", the last shuffled apart" if order["last_epoch_apart"] else ""
    return (f"{Path(order['corpus']).name}: {epochs}{apart}, sequence {order['seq_length']}, "
            f"seed {order['seed']}")  # fmt: skip


def check_resumed_order(saved: dict[str, Any] | None, now: dict[str, Any], keys: str) -> None:
    """A ConfigError unless this run's sample order `now` is the checkpoint's (`saved`; None:
    a checkpoint that kept none). `keys`: the settings that size the schedule."""
    if saved is None or saved == now:
        return
    raise ConfigError(
        f"the checkpoint's run drew its samples in another order ({_describe(saved)}) than "
        f"this run draws ({_describe(now)}): resumed, it would repeat some samples and skip "
        "others",
        hint=f"resume with the checkpoint's schedule ({keys}) and data settings, or start a new "
        "run (another exp_name)",
    )


def check_run_order(run_dir: Path, now: dict[str, Any], step: int, keys: str, write: bool) -> None:
    """For a run that keeps its sample order in its directory: a resume (`step` > 0) is
    checked against the order kept there; the order is kept (where `write`: one process)."""
    import contextlib
    import json

    from primus.core.reliability.atomic import write_json

    path = run_dir / ORDER_FILE
    saved = None
    if step > 0 and path.is_file():
        with contextlib.suppress(OSError, ValueError):  # unreadable (edited): nothing to check
            saved = json.loads(path.read_text())
        saved = saved if isinstance(saved, dict) else None
        check_resumed_order(saved, now, keys)
    if write and saved is None:
        write_json(path, now)
