"""Adapter for MaxText (the maxtext wheel, JAX)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.config import ModuleConfig, ParamSchema
from primus.core.config.schema import registered_params

TESTED = ">=0.2.5,<0.3"  # the maxtext versions the patches were tested on


class MaxTextAdapter(BackendAdapter):
    """Builds MaxText's config through its pyconfig; the trainer runs MaxText's training loop.

    Params are MaxText's own config keys (base.yml's, flat), plus the keys Primus's patches
    register. JAX runs one process per host (or per GPU), started by Primus's own spawner: the
    coordinator is MASTER_ADDR:MASTER_PORT, not torchrun's store.
    """

    trainers = {"pretrain": "primus.backends.maxtext.pretrain_trainer:MaxTextPretrainTrainer"}

    tested_versions = TESTED
    launcher = "spawn"

    def param_schema(self) -> ParamSchema:
        from primus.backends.maxtext.config_bridge import maxtext_schema

        return maxtext_schema()

    def convert_config(self, config: ModuleConfig) -> Any:
        from primus.backends.maxtext.config_bridge import build_config

        return build_config(config, registered_params(self.framework))

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        from primus.backends.maxtext.checkpoints import preset_from_hf

        return preset_from_hf(hf_config)

    def inspect_checkpoint(self, path: Path) -> dict[str, Any] | None:
        from primus.backends.maxtext.checkpoints import inspect_checkpoint

        return inspect_checkpoint(path)
