"""Adapter for Megatron-LM's training loop (`megatron.training` in the megatron-core wheel)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.config.data_section import DataConfig
from primus.core.config.schema_cache import schema_of
from primus.core.devices import DEVICE_PARAM
from primus.core.errors import ConfigError
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import log_rank_0
from primus.core.projection import Job

TESTED = ">=0.19,<0.20"  # the megatron-core versions Primus's patches were tested on

# Keys Primus defines for this backend; every other key is a Megatron argument (its dest name).
PRIMUS_KEYS = ParamSchema(
    {
        "model_name": ParamSpec(str, "name of the model (set by model presets, shown in logs)"),
        "device": DEVICE_PARAM,
        "export_dtype": ParamSpec(
            str,
            "dtype of the tensors `primus checkpoint export` writes; default: that of the HF "
            "model the checkpoint came from, else the checkpoint's own",
            choices=("float32", "bfloat16", "float16"),
        ),
    }
)


class MegatronAdapter(BackendAdapter):
    """Builds Megatron's args namespace; the trainer calls `megatron.training.pretrain`."""

    trainers = {
        "pretrain": "primus.backends.megatron.pretrain_trainer:MegatronPretrainTrainer",
        "posttrain": "primus.backends.megatron.posttrain_trainer:MegatronPosttrainTrainer",
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
    # Training choices in `model_preset_from_hf`'s result, not architecture (with RoPE,
    # max_position_embeddings only bounds seq_length: no weight or frequency depends on it).
    hf_preset_training_keys = frozenset(
        {"seq_length", "max_position_embeddings", "attention_dropout", "hidden_dropout"}
    )
    hf_export_dtype_key = "export_dtype"

    def prepare_backend(self, config: ModuleConfig) -> None:
        import importlib.util

        from primus.backends.megatron.config.bridge import silence_import_notices

        silence_import_notices()
        get_torchrun_env().export()  # Megatron reads RANK & co.; env:// needs MASTER_ADDR/PORT
        missing = [
            name
            for name in ("transformer_engine", "apex")
            if importlib.util.find_spec(name) is None
        ]
        model = config.params.get("model_name")
        if model:
            log_rank_0(f"[megatron] model: {model}")
        if missing:
            log_rank_0(f"[megatron] not installed: {', '.join(missing)} (pure-PyTorch paths used)")

    def check_inputs(self, config: ModuleConfig) -> None:
        from primus.backends.megatron.checkpoint.native import check_load
        from primus.backends.megatron.data.inputs import check_data_inputs

        check_data_inputs(config)
        check_load(config)

    def corpus_params(self, data: DataConfig) -> dict[str, tuple[Any, str]]:
        from primus.backends.megatron.data.inputs import corpus_params

        return corpus_params(data)

    def check_params(self, config: ModuleConfig, stage: str = "pretrain") -> str | None:
        from primus.backends.megatron.config.checks import check_params

        if stage == "posttrain":
            config.require_sft()
        return check_params(config, *self._own_schema())

    def checkpoint_bytes(self, config: ModuleConfig) -> int | None:
        from primus.backends.megatron.config.checks import checkpoint_bytes, megatron_values

        args = megatron_values(config, *self._own_schema())
        return checkpoint_bytes(args, lora=config.peft is not None)

    def _own_schema(self) -> tuple[ParamSchema, frozenset[str]]:
        """The schema (cached) and its keys that are Megatron's arguments."""
        schema = schema_of(self)
        assert schema is not None
        return schema, frozenset(schema.specs) - set(PRIMUS_KEYS.specs)

    def parallel_sizes(self, config: ModuleConfig) -> dict[str, int]:
        keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size")  # fmt: skip
        return {key: config.params.get(key) or 1 for key in keys}

    def check_launch(self, config: ModuleConfig, processes: int) -> None:
        from primus.backends.megatron.config.checks import check_batch, megatron_values

        replica = math.prod(self.parallel_sizes(config).values())
        check_batch(config, megatron_values(config, *self._own_schema()), processes // replica)

    def param_schema(self) -> ParamSchema:
        from primus.backends.megatron.config.bridge import megatron_schema

        return megatron_schema().merged(PRIMUS_KEYS)

    def convert_config(self, config: ModuleConfig) -> argparse.Namespace:
        from primus.backends.megatron.config.bridge import build_megatron_args, megatron_actions

        actions = megatron_actions()
        args = build_megatron_args(config, {k: v for k, v in config.params.items() if k in actions})
        # the module's `sft:`/`peft:`/`dpo:` (None when absent) for the posttrain trainer, export
        args.primus_sft, args.primus_peft, args.primus_dpo = config.sft, config.peft, config.dpo
        return args

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        from primus.backends.megatron.checkpoint.native import preset_from_hf

        return preset_from_hf(hf_config)

    def hf_import_dir(self, backend_args: Any) -> Path | None:
        folder = backend_args.load or backend_args.save
        if folder is None:
            raise ConfigError(
                "megatron: the experiment has no checkpoint folder to import into",
                hint="set save_interval (checkpoints go into the run directory) or load",
            )
        return Path(folder)

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        from primus.backends.megatron.checkpoint.hf import import_hf

        import_hf(hf_dir, backend_args, out)

    def export_hf(
        self, backend_args: Any, iteration: int | None, out: Path, dtype: str | None
    ) -> None:
        from primus.backends.megatron.checkpoint.hf import export_hf

        export_hf(backend_args, iteration, out, dtype)

    def lora_adapters(self, backend_args: Any, iteration: int | None) -> dict[str, Any]:
        from primus.backends.megatron.checkpoint.hf import lora_adapters

        return lora_adapters(backend_args, iteration)

    def training_job(self, backend_args: Any, gpus: int, applied: frozenset[str]) -> Job:
        from primus.backends.megatron.projection import training_job

        return training_job(backend_args, gpus, applied)

    def layout_overrides(self, job: Job) -> dict[str, Any]:
        from primus.backends.megatron.projection import layout_overrides

        return layout_overrides(job)

    def inspect_checkpoint(self, path: Path) -> dict[str, Any] | None:
        from primus.backends.megatron.checkpoint.native import inspect_checkpoint

        return inspect_checkpoint(path)
