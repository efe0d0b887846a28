"""Adapter for MaxText (the maxtext wheel, JAX)."""

from __future__ import annotations

from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.config import ModuleConfig, ParamSchema
from primus.core.config.schema import registered_params
from primus.core.errors import ConfigError
from primus.core.trainer.base_trainer import BaseTrainer

TESTED = ">=0.2.5,<0.3"  # the maxtext versions the patches were tested on


class MaxTextAdapter(BackendAdapter):
    """Builds MaxText's config through its pyconfig; the trainer runs MaxText's training loop.

    Params are MaxText's own config keys (base.yml's, flat), plus the keys Primus's patches
    register. JAX runs one process per host (or per GPU), started by Primus's own spawner: the
    coordinator is MASTER_ADDR:MASTER_PORT, not torchrun's store.
    """

    launcher = "spawn"

    def param_schema(self) -> ParamSchema:
        from primus.backends.maxtext.config_bridge import maxtext_schema

        return maxtext_schema()

    def convert_config(self, config: ModuleConfig) -> Any:
        from primus.backends.maxtext.config_bridge import build_config

        return build_config(config, registered_params(self.framework))

    def load_trainer_class(self, stage: str = "pretrain") -> type[BaseTrainer]:
        if stage != "pretrain":
            raise ConfigError(f"the maxtext backend has no '{stage}' stage yet (it has: pretrain)")
        from primus.backends.maxtext.pretrain_trainer import MaxTextPretrainTrainer

        return MaxTextPretrainTrainer
