"""BackendAdapter: how a training framework plugs into Primus (the original backend guide's
contract, extended with optional capabilities)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import importlib_metadata
from packaging.requirements import Requirement

from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0

if TYPE_CHECKING:
    from primus.core.config.data_section import DataConfig
    from primus.core.config.experiment import ModuleConfig
    from primus.core.config.schema import ParamSchema
    from primus.core.projection import Job
    from primus.core.trainer.base_trainer import BaseTrainer


class BackendAdapter(ABC):
    """Integrates one training framework. Subclasses import their upstream lazily, never at
    module import time, so discovery, inventories and `primus --help` stay instant.

    `trainers` maps each stage the backend runs to its trainer class, as "module:Class"
    (imported only when that stage runs): `trainers = {"pretrain": "pkg.trainer:MyTrainer"}`.
    An adapter may override `load_trainer_class` instead (the original backend guide's way).

    `upstream_requirement` (PEP 508, e.g. "someframework>=0.17,<0.20") defaults to the
    `upstream` extra of the distribution that ships the adapter; set it here for adapters
    registered in-process with `BackendRegistry.register_adapter`.
    """

    trainers: ClassVar[dict[str, str]] = {}
    # The optional capabilities this backend provides (names of `capabilities.CAPABILITIES`:
    # "hf-import", "hf-export", "checkpoint-inspect", "memory-projection", "lora", "corpus"...); each needs
    # its hooks implemented, and a hook implemented needs its capability declared.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    upstream_requirement: ClassVar[str | None] = None
    # The upstream versions Primus's patches were tested on (PEP 440 specifier set): the gate
    # of every patch registered with `backend_versions=TESTED` (those touching private names).
    tested_versions: ClassVar[str | None] = None
    third_party_dir_name: ClassVar[str | None] = None  # default: the framework name
    # How `--nproc-per-node`/`--nnodes` start workers: "torchrun" (torch.distributed.run), or
    # "spawn" (Primus's spawner: torchrun's variables, no torch, nothing bound to MASTER_PORT).
    launcher: ClassVar[str] = "torchrun"
    # Modules the backend never uses but its upstream imports on the way (slowly): hidden
    # (their import fails, as if not installed) before the upstream is imported, in each
    # process that runs the backend (training, a conversion, a projection).
    unused_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, framework: str) -> None:
        self.framework = framework
        # Set by the runtime before the config is converted when this process only converts a
        # checkpoint (`primus checkpoint import|export`) or describes the job (`primus
        # projection`, `primus benchmark --config`): the adapter may leave accelerators alone
        # (no device start-up, no device libraries in memory).
        self.host_only = False

    # -- hooks the runtime calls, in this order -------------------------------------------
    def setup_backend_path(self, backend_path: str | None = None) -> str:
        """Put a source checkout of the upstream first on sys.path, if there is one.

        Looks at `backend_path`, then $BACKEND_PATH, then ./third_party/<name>; returns the
        folder used, or "" when the installed package is used.
        """
        name = self.third_party_dir_name or self.framework
        for candidate in (backend_path, os.environ.get("BACKEND_PATH"), f"third_party/{name}"):
            if candidate and Path(candidate).is_dir():
                folder = str(Path(candidate).resolve())
                if folder not in sys.path:
                    sys.path.insert(0, folder)
                log_rank_0(f"[{self.framework}] using the upstream source tree at {folder}")
                return folder
        return ""

    def prepare_backend(self, config: ModuleConfig) -> None:  # noqa: B027 - optional hook
        """One-time backend set-up before the config is converted (imports, framework init)."""

    def check_inputs(self, config: ModuleConfig) -> None:  # noqa: B027 - optional hook
        """The files the module's params name (data, tokenizers), checked without importing the
        upstream: a ConfigError at the key of the first that is missing or malformed (helpers
        in `primus.core.config.inputs`). Runs before the upstream is imported and before
        anything is written, for a run, a dry run and `config validate`."""

    def check_params(self, config: ModuleConfig, stage: str = "pretrain") -> str | None:
        """What the schema cannot check, without importing the upstream: values across keys,
        ranges (`config.require(rules)`), refusals the upstream makes only when it builds the
        model, what `stage` needs (`config.require_sft()`); a ConfigError at the key at fault.
        Runs after the schema check, for every run and `config validate`. Return None, or why
        only the full check (the upstream imported, the patches applied, `convert_config`) can
        judge these params: `config validate` and a dry run then run it."""
        return None

    def parallel_sizes(self, config: ModuleConfig) -> dict[str, int]:
        """The params whose product must divide the number of processes a launch starts (the
        ranks one model replica spans: tensor, pipeline, context parallel), with their values,
        defaults filled, read without the upstream. Empty: the backend does not say."""
        return {}

    def check_launch(self, config: ModuleConfig, processes: int) -> None:  # noqa: B027
        """What a launch of `processes` processes must agree with beyond `parallel_sizes`
        dividing it (the global batch split into micro-batches over the data-parallel ranks),
        read without the upstream: a ConfigError at the key at fault. Optional hook."""

    def checkpoint_bytes(self, config: ModuleConfig) -> int | None:
        """About how many bytes one checkpoint of this run takes (the model's weights and the
        optimizer state it saves), from the params alone, without the upstream (build a
        `primus.core.projection.Model` and count its parameters). None: the run saves no
        checkpoint, or the backend cannot tell. A workspace with less room is refused."""
        return None

    @abstractmethod
    def convert_config(self, config: ModuleConfig) -> Any:
        """Turn the resolved module params into the backend's own args object."""

    def load_trainer_class(self, stage: str = "pretrain") -> type[BaseTrainer]:
        """The trainer class for a stage (`pretrain`, `posttrain`), from `trainers`."""
        self.check_stage(stage)
        module, _, name = self.trainers[stage].partition(":")
        return getattr(importlib.import_module(module), name)

    def check_stage(self, stage: str) -> None:
        """A ConfigError unless `trainers` declares `stage` (no-op when it declares nothing)."""
        if self.trainers and stage not in self.trainers:
            raise ConfigError(
                f"the {self.framework} backend has no '{stage}' stage",
                hint=f"it runs: {', '.join(self.trainers)}",
            )

    def detect_backend_version(self) -> str | None:
        """The installed upstream version, read from distribution metadata without importing it."""
        if not self.upstream_requirement:
            return None
        try:
            return importlib_metadata.version(Requirement(self.upstream_requirement).name)
        except importlib_metadata.PackageNotFoundError:
            return None

    # -- what the adapter declares --------------------------------------------------------
    def param_schema(self) -> ParamSchema | None:
        """The keys the backend accepts (upstream's own plus Primus's). None: not checked."""
        return None

    def model_preset_from_hf(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        """This backend's model preset (its own keys) for an HF config.json's dict.

        Raise a ConfigError naming the field for an architecture the backend cannot express.
        `primus.core.checkpoint.hf.HFArchitecture` parses and checks the common fields.
        """
        raise ConfigError(
            f"the {self.framework} backend cannot derive model presets from HF configs"
        )

    # Keys of `model_preset_from_hf`'s result that are training choices, not architecture:
    # `init_from` does not compare them with the experiment (dotted for nested presets).
    hf_preset_training_keys: ClassVar[frozenset[str]] = frozenset()

    def hf_import_dir(self, backend_args: Any) -> Path | None:
        """The folder `import_hf` fills for the run these args describe: the run starts from
        it while it has no checkpoint of its own. None: this backend cannot import."""
        return None

    def import_hf(self, hf_dir: Path, backend_args: Any, out: Path) -> None:
        """Write the HF model in `hf_dir` into `out` (an empty staging folder that core renames
        to `hf_import_dir(backend_args)` once this returns) in the backend's native format,
        loadable at the parallelism of `backend_args`. Stream tensors: never two full copies
        of the model in memory. Raise ConfigError naming the file and tensor for bad input."""
        raise ConfigError(f"the {self.framework} backend cannot import HF checkpoints")

    # The backend's option for the dtype an export writes (dotted), if it has one: set in the
    # experiment, it wins over the dtype of the HF model the checkpoint came from.
    hf_export_dtype_key: ClassVar[str | None] = None

    def export_hf(
        self, backend_args: Any, iteration: int | None, out: Path, dtype: str | None
    ) -> None:
        """Write the native checkpoint of the run these args describe (the latest, or
        `iteration`) as an HF model directory (config.json + *.safetensors, and the tokenizer
        when the experiment has one) into `out`, an empty staging folder, with tensors in
        `dtype` (float32, bfloat16 or float16; None: the checkpoint's own). Core then carries
        over what the args cannot say from the HF model the checkpoint came from."""
        raise ConfigError(f"the {self.framework} backend cannot export HF checkpoints")

    def corpus_params(self, data: DataConfig) -> dict[str, tuple[Any, str]]:
        """The params that make this backend pretrain on `data:`'s prepared corpora in their
        standard sample order (`primus.core.data.samples`): dotted key -> (value, the `data:`
        key it says, whose line becomes its origin; "" for what the section only implies, such
        as mock data off). A ConfigError (`data.error(key, ...)`) for what it cannot read."""
        raise ConfigError(f"the {self.framework} backend cannot read prepared corpora")

    def lora_adapters(self, backend_args: Any, iteration: int | None) -> dict[str, Any]:
        """The LoRA adapters of the run's checkpoint (the latest, or `iteration`), in HF
        space: HF module name (`model.layers.0.self_attn.q_proj`) -> (A: rank x in, B: out x
        rank) torch tensors, the HF weight then being W + (alpha / rank) B A. Core writes them
        as a PEFT adapter (`primus.core.checkpoint.peft_adapter`)."""
        raise ConfigError(f"the {self.framework} backend cannot export LoRA adapters")

    def training_job(self, backend_args: Any, gpus: int, applied: frozenset[str]) -> Job:
        """The job `backend_args` describe, run on `gpus` GPUs, as the memory projection sees
        it (`primus.core.projection.Job`): the model, the parallel layout, the bytes of each
        parameter's state and what the backend's kernels keep for the backward. `applied`: the
        ids of the patches the build applied (a kernel patch changes what is kept). Raise a
        ConfigError for a layout `gpus` cannot hold."""
        raise ConfigError(f"the {self.framework} backend has no memory projection")

    def layout_overrides(self, job: Job) -> dict[str, Any]:
        """The experiment's keys and values that give `job`'s parallel layout, micro batch and
        recompute (`tp`, `pp`, `cp`, `ep`, `zero`, `micro_batch`, `sequence_parallel`,
        `recompute`), as `key=value` overrides: what `primus projection performance --gpus`
        prints for a user to paste. A ConfigError: the backend cannot run this layout (the
        ranking leaves it out)."""
        raise ConfigError(f"the {self.framework} backend has no memory projection")

    def inspect_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """What the native checkpoint at `path` is (format, iteration, model, parallel, size),
        or None when `path` is not one of this backend's checkpoints. Cheap when it is not."""
        return None

    @classmethod
    def preset_dirs(cls) -> list[Path]:
        """Folders holding `modules/*.yaml` and `models/*.yaml` presets shipped with the backend.

        Default: the `configs` folder beside the module of the adapter class and of each
        adapter it derives from (a subclass's own presets first).
        """
        folders = []
        for klass in cls.__mro__:
            if issubclass(klass, BackendAdapter) and klass is not BackendAdapter:
                folder = Path(inspect.getfile(klass)).parent / "configs"
                if folder.is_dir() and folder not in folders:
                    folders.append(folder)
        return folders
