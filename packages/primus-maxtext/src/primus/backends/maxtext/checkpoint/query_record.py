"""What an HF import folder says about its query weights: `RECORD` in it means they are HF's,
unscaled, and a model loading it applies attention's 1/sqrt(head_dim) at run time
(model/query_scale.py says why); without it they hold MaxText's folded scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECORD = "query_scale.json"  # in an import folder: its query weights leave the scale out
CONVERSION_HOOK = "scale_query_layer"  # MaxText's conversion hook that folds the scale


def write_record(import_folder: Path) -> None:
    """Record in an import folder that its query weights are HF's, unscaled."""
    (import_folder / RECORD).write_text(json.dumps({"query_scale": "at run time"}) + "\n")


def scaled_at_run_time(config: Any) -> bool:
    """Whether the model of MaxText `config` loads an import whose queries are HF's, unscaled
    (`load_parameters_path` is `<import folder>/<step>/items`)."""
    path = getattr(config, "load_parameters_path", "")
    return bool(path) and (Path(path).parent.parent / RECORD).is_file()
