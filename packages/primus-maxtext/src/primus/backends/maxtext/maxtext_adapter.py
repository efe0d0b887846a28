"""Adapter for MaxText (the maxtext wheel, JAX)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec, register_params
from primus.core.config.data_section import DataConfig
from primus.core.config.schema import registered_params
from primus.core.config.schema_cache import schema_of

if TYPE_CHECKING:
    from primus.core.projection import Job

TESTED = ">=0.2.5,<0.3"  # the maxtext versions the patches were tested on

register_params(
    "maxtext",
    {
        "export_dtype": ParamSpec(
            str,
            "dtype of the tensors `primus checkpoint export` writes (TorchTitan's "
            "checkpoint.export_dtype); default: that of the HF model the checkpoint came "
            "from, else weight_dtype",
            choices=("float32", "bfloat16", "float16"),
        ),
        "dataset_blend": ParamSpec(
            list,
            "prepared corpora blended by weight, [{path: PREFIX, weight: W}, ...], instead of "
            "dataset_path (dataset_type: indexed)",
        ),
    },
)


class MaxTextAdapter(BackendAdapter):
    """Builds MaxText's config through its pyconfig; the trainer runs MaxText's training loop.

    Params are MaxText's own config keys (base.yml's, flat), plus the keys Primus registers
    (its patches' and `export_dtype`). JAX runs one process per host (or per GPU), started by
    Primus's own spawner: the coordinator is MASTER_ADDR:MASTER_PORT, not torchrun's store.
    """

    trainers = {
        "pretrain": "primus.backends.maxtext.pretrain_trainer:MaxTextPretrainTrainer",
        "posttrain": "primus.backends.maxtext.posttrain_trainer:MaxTextPosttrainTrainer",
    }
    capabilities = frozenset(
        {
            "hf-import",
            "hf-export",
            "checkpoint-inspect",
            "memory-projection",
            "corpus",
            "lora",
            "lora-export",
        }
    )

    tested_versions = TESTED
    launcher = "spawn"
    # MaxText imports torch through tensorboardX, and transformers (for its HF configs), which
    # then imports torch and torchvision: seconds of start-up a JAX process has no use for
    unused_modules = ("torch", "torchvision", "torchaudio")

    def check_inputs(self, config: ModuleConfig) -> None:
        from primus.backends.maxtext.checkpoint.native import check_load_paths
        from primus.backends.maxtext.data.inputs import check_data_inputs

        check_data_inputs(config)
        check_load_paths(config)

    def corpus_params(self, data: DataConfig) -> dict[str, tuple[Any, str]]:
        from primus.backends.maxtext.data.inputs import corpus_params

        return corpus_params(data)

    def param_schema(self) -> ParamSchema:
        """MaxText's config keys; `dataset_type` also takes `indexed`, a prepared corpus (the
        patch maxtext.corpus turns it into a value MaxText knows)."""
        from primus.backends.maxtext.config.bridge import maxtext_schema
        from primus.backends.maxtext.data.inputs import INDEXED

        schema = maxtext_schema()
        spec = schema.specs["dataset_type"]
        choices = (*(spec.choices or ()), INDEXED)
        text = f"{spec.help} (or {INDEXED}: the prepared corpus at dataset_path)"
        widened = replace(spec, choices=choices, help=text)
        return schema.merged(ParamSchema({"dataset_type": widened}))

    # the preset's keys that are training choices, not architecture
    hf_preset_training_keys = frozenset({"enable_dropout"})
    hf_export_dtype_key = "export_dtype"

    def check_params(self, config: ModuleConfig, stage: str = "pretrain") -> str | None:
        from primus.backends.maxtext.config.bridge import check_params

        if stage == "posttrain":
            config.require_sft()
        schema = schema_of(self)
        assert schema is not None
        check_params(config, schema)
        return None

    def check_launch(self, config: ModuleConfig, processes: int) -> None:
        from primus.backends.maxtext.config.checks import check_launch

        schema = schema_of(self)
        assert schema is not None
        check_launch(config, schema, processes)

    def checkpoint_bytes(self, config: ModuleConfig) -> int | None:
        from primus.backends.maxtext.projection import checkpoint_bytes

        schema = schema_of(self)
        assert schema is not None
        values = {key: spec.default for key, spec in schema.specs.items()} | config.params
        return checkpoint_bytes(values, lora=config.peft is not None)

    def convert_config(self, config: ModuleConfig) -> Any:
        """MaxText's config; a run with `init_from` (or an import folder already there)
        starts from the import through `load_parameters_path`, which MaxText reads only
        while the run's own checkpoint folder has no step."""
        from primus.backends.maxtext.checkpoint.hf import import_dir, params_path
        from primus.backends.maxtext.config.bridge import build_config

        if self.host_only:  # a conversion: JAX's CPU backend, no CUDA start-up or libraries
            import jax

            jax.config.update("jax_platforms", "cpu")
        owned = registered_params(self.framework)
        params = config.params
        if params.get("load_parameters_path") or params.get("load_full_state_path"):
            return build_config(config, owned)
        run = {k: params.get(k) for k in ("base_output_directory", "run_name")}
        if not all(run.values()):
            return build_config(config, owned)
        folder = import_dir(run)
        if config.init_from is None and not folder.is_dir():
            return build_config(config, owned)
        return build_config(config, owned, load_parameters_path=str(params_path(folder)))

    def hf_import_dir(self, backend_args: Any) -> Path | None:
        from primus.backends.maxtext.checkpoint.hf import import_dir

        return import_dir(backend_args.config)

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        from primus.backends.maxtext.checkpoint.hf import import_hf

        import_hf(hf_dir, backend_args.argv, out)

    def export_hf(
        self, backend_args: Any, iteration: int | None, out: Path, dtype: str | None
    ) -> None:
        from primus.backends.maxtext.checkpoint.hf import export_hf

        export_hf(backend_args, iteration, out, dtype)

    def lora_adapters(self, backend_args: Any, iteration: int | None) -> dict[str, Any]:
        from primus.backends.maxtext.checkpoint.hf import lora_adapters

        return lora_adapters(backend_args, iteration)

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        from primus.backends.maxtext.checkpoint.native import preset_from_hf

        return preset_from_hf(hf_config)

    def training_job(self, backend_args: Any, gpus: int, applied: frozenset[str]) -> Job:
        from primus.backends.maxtext.projection import training_job

        return training_job(backend_args, gpus, applied)

    def layout_overrides(self, job: Job) -> dict[str, Any]:
        from primus.backends.maxtext.projection import layout_overrides

        return layout_overrides(job)

    def inspect_checkpoint(self, path: Path) -> dict[str, Any] | None:
        from primus.backends.maxtext.checkpoint.native import inspect_checkpoint

        return inspect_checkpoint(path)
