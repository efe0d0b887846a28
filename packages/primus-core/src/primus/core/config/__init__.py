"""The config system: one loader, one representation, provenance for every value."""

from primus.core.config.experiment import Experiment, ModuleConfig, load_experiment
from primus.core.config.schema import (
    ALL_BACKENDS,
    ParamSchema,
    ParamSpec,
    register_params,
)

__all__ = [
    "ALL_BACKENDS",
    "Experiment",
    "ModuleConfig",
    "ParamSchema",
    "ParamSpec",
    "load_experiment",
    "register_params",
]
