"""Adapter for TorchTitan's Trainer (the torchtitan wheel)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.config.data_section import DataConfig
from primus.core.config.schema import registered_params
from primus.core.config.schema_cache import schema_of
from primus.core.devices import DEVICE_PARAM
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import log_rank_0
from primus.core.projection import Job

TESTED = ">=0.3,<0.4"  # the torchtitan versions Primus's patches were tested on

# Keys Primus defines for this backend; the rest is TorchTitan's Trainer.Config (nested YAML).
PRIMUS_KEYS = ParamSchema(
    {
        "model_name": ParamSpec(str, "name of the model (set by model presets; the flavor's name)"),
        "device": DEVICE_PARAM,
        "mock_data": ParamSpec(
            bool, "train on a synthetic token stream (no tokenizer or dataset needed)"
        ),
        "dataloader.seed": ParamSpec(
            int, "seed of a prepared corpus's sample order (dataloader.dataset: indexed)"
        ),
        "dataloader.blend": ParamSpec(
            list,
            "prepared corpora blended by weight, [{path: PREFIX, weight: W}, ...], instead of "
            "dataloader.dataset_path (dataloader.dataset: indexed)",
        ),
    }
)


def owned_keys() -> ParamSchema:
    """Keys Primus consumes itself; every other param becomes a TorchTitan CLI flag."""
    from primus.backends.torchtitan.config.bridge import AC_MODE, OPTIMIZER_KEYS
    from primus.backends.torchtitan.model.flavors import MODEL_KEYS

    return PRIMUS_KEYS.merged(
        ParamSchema({**MODEL_KEYS, **OPTIMIZER_KEYS, AC_MODE: ParamSpec(str)}),
        registered_params("torchtitan"),
    )


class TorchTitanAdapter(BackendAdapter):
    """Builds TorchTitan's Trainer.Config; the trainer builds and runs TorchTitan's Trainer."""

    trainers = {
        "pretrain": "primus.backends.torchtitan.pretrain_trainer:TorchTitanPretrainTrainer",
        "posttrain": "primus.backends.torchtitan.posttrain_trainer:TorchTitanPosttrainTrainer",
    }
    capabilities = frozenset(
        {
            "hf-import",
            "hf-export",
            "checkpoint-inspect",
            "memory-projection",
            "lora",
            "lora-export",
            "dpo",
            "corpus",
        }
    )
    tested_versions = TESTED
    # TorchTitan's own option; unset, an export writes the dtype of the HF model it came from
    hf_export_dtype_key = "checkpoint.export_dtype"

    def prepare_backend(self, config: ModuleConfig) -> None:
        get_torchrun_env().export()  # torch.distributed reads RANK & co. and MASTER_ADDR/PORT
        model = config.params.get("model_name")
        if model:
            log_rank_0(f"[torchtitan] model: {model}")

    def check_inputs(self, config: ModuleConfig) -> None:
        from primus.backends.torchtitan.checkpoint.native import check_initial_load
        from primus.backends.torchtitan.data.inputs import check_data_inputs

        check_data_inputs(config)
        check_initial_load(config)

    def param_schema(self) -> ParamSchema:
        from primus.backends.torchtitan.config.bridge import torchtitan_schema
        from primus.backends.torchtitan.model.flavors import MODEL_KEYS

        return torchtitan_schema().merged(PRIMUS_KEYS, ParamSchema(MODEL_KEYS))

    def corpus_params(self, data: DataConfig) -> dict[str, tuple[Any, str]]:
        from primus.backends.torchtitan.data.inputs import corpus_params

        return corpus_params(data)

    def check_params(self, config: ModuleConfig, stage: str = "pretrain") -> str | None:
        from primus.backends.torchtitan.config.bridge import check_params
        from primus.backends.torchtitan.config.checks import (
            check_batch,
            check_cpu_features,
            check_sequence,
            check_validator,
        )
        from primus.backends.torchtitan.model.flavors import check_model
        from primus.backends.torchtitan.posttrain.checks import check_finetuning

        if stage == "posttrain":
            config.require_sft()
        check_params(config)
        check_model(config)
        check_batch(config, self._value(config))
        check_sequence(config, self._value(config))
        if stage == "pretrain":  # post-training's validator reads the eval split
            check_validator(config, self._value(config))
        check_cpu_features(config, self._value(config))
        check_finetuning(config, self._value(config))
        return None

    def _value(self, config: ModuleConfig) -> Callable[[str], Any]:
        """A dotted key's value in the params, else TorchTitan's default (the cached schema)."""
        schema = schema_of(self)
        assert schema is not None

        def value(key: str) -> Any:
            *sections, name = key.split(".")
            node: Any = config.params
            for section in sections:
                node = node.get(section) if isinstance(node, dict) else None
            default = schema.specs[key].default
            return node.get(name, default) if isinstance(node, dict) else default

        return value

    def parallel_sizes(self, config: ModuleConfig) -> dict[str, int]:
        degrees = config.params.get("parallelism") or {}
        names = ("tensor", "pipeline", "context", "data_parallel_replicate", "data_parallel_shard")
        sizes = {}
        for name in names:
            key = f"{name}_degree" if name.startswith("data") else f"{name}_parallel_degree"
            value = degrees.get(key)
            if isinstance(value, int) and value > 0:  # data_parallel_shard -1: the rest
                sizes[f"parallelism.{key}"] = value
        return sizes

    def check_launch(self, config: ModuleConfig, processes: int) -> None:
        from primus.backends.torchtitan.config.checks import check_launch

        check_launch(config, self._value(config), processes)

    def checkpoint_bytes(self, config: ModuleConfig) -> int | None:
        from primus.backends.torchtitan.projection import checkpoint_bytes

        return checkpoint_bytes(config.params, self._value(config), lora=config.peft is not None)

    def convert_config(self, config: ModuleConfig) -> Any:
        from primus.backends.torchtitan.config.bridge import build_trainer_config

        return build_trainer_config(config, owned_keys(), bool(config.params.get("mock_data")))

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        from primus.backends.torchtitan.checkpoint.native import preset_from_hf

        return preset_from_hf(hf_config)

    def hf_import_dir(self, backend_args: Any) -> Path:
        from primus.backends.torchtitan.checkpoint.hf import import_dir

        return import_dir(backend_args)

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        from primus.backends.torchtitan.checkpoint.hf import import_hf

        import_hf(hf_dir, backend_args, out)

    def export_hf(
        self, backend_args: Any, iteration: int | None, out: Path, dtype: str | None
    ) -> None:
        from primus.backends.torchtitan.checkpoint.hf import export_hf, tokenizer_dir
        from primus.core.checkpoint.export import copy_tokenizer

        source = export_hf(backend_args, iteration, out, dtype)
        tokenizer = tokenizer_dir(backend_args)
        copied = copy_tokenizer(tokenizer, out) if tokenizer else []
        log_rank_0(
            f"[torchtitan] exported {source}" + (f" with {tokenizer}'s tokenizer" if copied else "")
        )

    def lora_adapters(self, backend_args: Any, iteration: int | None) -> dict[str, Any]:
        from primus.backends.torchtitan.checkpoint.hf import lora_adapters

        return lora_adapters(backend_args, iteration)

    def training_job(self, backend_args: Any, gpus: int, applied: frozenset[str]) -> Job:
        from primus.backends.torchtitan.projection import training_job

        return training_job(backend_args, gpus, applied)

    def layout_overrides(self, job: Job) -> dict[str, Any]:
        from primus.backends.torchtitan.projection import layout_overrides

        return layout_overrides(job)

    def inspect_checkpoint(self, path: Path) -> dict[str, Any] | None:
        from primus.backends.torchtitan.checkpoint.native import inspect_checkpoint

        return inspect_checkpoint(path)
