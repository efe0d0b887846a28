"""TorchTitan's `Trainer.Config` from Primus params, through TorchTitan's own ConfigManager.

Primus builds the base config (model spec from the preset's flavor, loss, optimizer, data), hands
it to `ConfigManager.parse_args` as a config_registry function, and passes every other param as
the CLI flag TorchTitan would take (`training.steps: 20` -> `--training.steps 20`). tyro parses
and type-checks them and `Trainer.Config` validates itself, exactly as `torchtitan.train` does.
The schema is the same dataclass tree walked field by field.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import re
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.config.sanity import (
    FRACTION_PAIR,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Rules,
    positive_or_minus_one,
)
from primus.core.errors import ConfigError

AC_MODE = "activation_checkpoint.mode"
# TorchTitan's optimizers (OptimizersContainer._resolve_optimizer_factory): another name fails
# only when the optimizer is built, after start-up
OPTIMIZERS = ("Adam", "AdamW", "DistMuon")
OPTIMIZER_KEYS = {
    "optimizer.name": ParamSpec(str, "optimizer of the catch-all param group", choices=OPTIMIZERS),
    "optimizer.lr": ParamSpec(float, "learning rate"),
    "optimizer.betas": ParamSpec(list, "Adam betas"),
    "optimizer.eps": ParamSpec(float, "Adam epsilon"),
    "optimizer.weight_decay": ParamSpec(float, "weight decay"),
}
_PENDING: list[Any] = []  # the base config `primus_base` hands to ConfigManager


def primus_base() -> Any:
    """config_registry function for ConfigManager: the base config Primus just built."""
    return _PENDING[-1]


@contextlib.contextmanager
def _pending(base: Any) -> Iterator[None]:
    _PENDING.append(base)
    try:
        yield
    finally:
        _PENDING.pop()


def _ac_variants() -> dict[str, type | None]:
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig

    variants = {}
    for option in typing.get_args(ActivationCheckpointingConfig):
        cls, marker = typing.get_args(option)[:2]
        variants[marker.name] = None if cls is type(None) else cls
    return variants


def _is_suppressed(field: dataclasses.Field) -> bool:
    return "Suppress" in str(field.type)


def _walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, default) for every settable leaf of a config dataclass."""
    for field in dataclasses.fields(obj):
        if field.name.startswith("_") or _is_suppressed(field):
            continue
        value = getattr(obj, field.name)
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{key}.")
        elif not isinstance(value, dict) and not (
            isinstance(value, list) and value and dataclasses.is_dataclass(value[0])
        ):
            yield key, field, value


def _spec(field: dataclasses.Field, default: Any) -> ParamSpec:
    kind: Any = None
    if isinstance(default, bool):
        kind = bool
    elif isinstance(default, int | float):
        kind = float if isinstance(default, float) or "float" in str(field.type) else int
    elif isinstance(default, str):
        kind = str
    elif isinstance(default, list | tuple):
        kind = list
    # TorchTitan's command line parses null as None only where the field's type admits it
    nullable = kind is None or any(word in str(field.type) for word in ("None", "Optional", "Any"))
    return ParamSpec(kind, default=default, choices=_literal_choices(field.type), nullable=nullable)


def _literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a `Literal[...]` annotation (as a type or as its text), else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if isinstance(annotation, str) and annotation.startswith("Literal[") and annotation[-1] == "]":
        values = ast.literal_eval(f"({annotation[len('Literal[') : -1]},)")
        return values if isinstance(values, tuple) else None
    return None


def _schema_config() -> Any:
    """TorchTitan's Trainer.Config with its own defaults (their warnings, such as
    "initial_load_model_only=True has no effect", unprinted: no run is configured here)."""
    import logging

    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    logging.disable(logging.WARNING)
    try:
        return Trainer.Config(
            loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()),
            optimizer=default_adamw(),
            dataloader=HuggingFaceTextDataLoader.Config(),
        )
    finally:
        logging.disable(logging.NOTSET)


@cache
def torchtitan_schema() -> ParamSchema:
    """Every key TorchTitan's Trainer.Config takes, plus Primus's shorthands for the optimizer
    and the activation-checkpointing mode."""
    specs = {key: _spec(field, default) for key, field, default in _walk(_schema_config())}
    specs = {k: v for k, v in specs.items() if not k.startswith("activation_checkpoint.")}
    variants = _ac_variants()
    for cls in filter(None, variants.values()):
        for key, field, default in _walk(cls(), "activation_checkpoint."):
            specs.setdefault(key, _spec(field, default))
    specs[AC_MODE] = ParamSpec(
        str, "activation checkpointing: " + ", ".join(variants), choices=tuple(variants)
    )
    specs.update(OPTIMIZER_KEYS)
    hints = {"checkpoint.folder_path": "write 'checkpoint.folder'"}
    return ParamSchema(specs, hints)


def _leaves(params: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in params.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _flag(key: str, value: Any, comma_list: bool) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        head, _, name = flag[2:].rpartition(".")
        return [flag] if value else [f"--{head}.no-{name}" if head else f"--no-{name}"]
    if value is None:
        return [flag, "None"]
    if isinstance(value, list | tuple):
        items = [str(item) for item in value]
        return [flag, ",".join(items)] if comma_list else [flag, *items]
    return [flag, str(value)]


@cache
def _comma_lists() -> frozenset[str]:
    """Keys typed `list[str]`: TorchTitan's CLI takes them comma separated."""
    return frozenset(
        key for key, field, _ in _walk(_schema_config()) if "list[str]" in str(field.type)
    )


def cli_args(params: dict[str, Any], owned: ParamSchema) -> list[str]:
    """TorchTitan CLI flags for every param that is TorchTitan's (not in `owned`)."""
    args: list[str] = []
    ac_args: list[str] = []
    mode = (params.get("activation_checkpoint") or {}).get("mode")
    for key, value in _leaves(params):
        if key in owned or key == AC_MODE:
            continue
        flags = _flag(key, value, key in _comma_lists())
        (ac_args if key.startswith("activation_checkpoint.") else args).extend(flags)
    if mode is not None or ac_args:  # tyro subcommand: its flags follow it
        args += [f"activation-checkpoint:{mode or 'selective'}", *ac_args]
    return args


def base_config(config: ModuleConfig, mock_data: bool) -> Any:
    """Trainer.Config with what TorchTitan's CLI cannot set: model, loss, optimizer, data."""
    from primus.backends.torchtitan.data.corpus import INDEXED, CorpusDataLoader
    from primus.backends.torchtitan.data.datasets import MockDataLoader, MockTokenizer
    from primus.backends.torchtitan.model.flavors import register_flavor
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.trainer import Trainer

    params = config.params
    compile_params = params.get("compile") or {}
    spec = register_flavor(
        config,
        compile_model=bool(compile_params.get("enable"))
        and "model" in compile_params.get("components", ["model", "loss"]),
    )
    vocab = decoder_vocab_size(spec)
    opt = params.get("optimizer") or {}
    optimizer = default_adamw(
        **{k: v for k, v in opt.items() if k in ("lr", "eps", "weight_decay") and v is not None}
    )
    group = optimizer.param_groups[0]
    if opt.get("betas") is not None:
        group.optimizer_kwargs["betas"] = tuple(opt["betas"])
    if opt.get("name"):
        group.optimizer_name = opt["name"]
    extra: dict[str, Any] = {}
    data = params.get("dataloader") or {}
    indexed = data.get("dataset") == INDEXED
    if mock_data or indexed:  # token ids already: the vocabulary size is all that is used
        extra = {"tokenizer": MockTokenizer.Config(vocab_size=vocab), "hf_assets_path": "."}
    dataloader = (
        MockDataLoader.Config()
        if mock_data
        else CorpusDataLoader.Config(**{k: data[k] for k in ("seed", "blend") if k in data})
        if indexed
        else HuggingFaceTextDataLoader.Config()
    )
    if config.sft is not None:  # fine-tuning: core's SFT rows (DPO's pairs), Primus's validator
        from primus.backends.torchtitan.posttrain.sft import SFTDataLoader, SFTValidator

        dataloader, extra["validator"] = (
            SFTDataLoader.Config(_sft=config.sft, _peft=config.peft, _dpo=config.dpo),
            SFTValidator.Config(),
        )
    if not (params.get("checkpoint") or {}).get("initial_load_path"):
        # TorchTitan's default (True) warns "has no effect without an initial_load_path" at
        # every parse; without one it means nothing (an HF import sets both, checkpoint.hf)
        extra["checkpoint"] = CheckpointManager.Config(initial_load_model_only=False)
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)),
        optimizer=optimizer,
        dataloader=dataloader,
        **extra,
    )


def _tyro_message(text: str) -> str:
    """The message inside tyro's error box (its first section), on one line."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("╭")), None)
    if start is None:
        return " ".join(line.strip() for line in lines if line.strip())
    body = []
    for line in lines[start + 1 :]:
        inner = line.strip().strip("│").strip()
        if line.startswith("╰") or (inner and set(inner) <= {"─"}):
            break
        body.append(inner)
    return " ".join(filter(None, body))


def _rejected(config: ModuleConfig, message: str, schema: ParamSchema) -> ConfigError:
    """A ConfigError at the first key TorchTitan's message names (flag or dotted spelling)."""
    message = _tyro_message(message)
    for match in re.finditer(r"--([a-z0-9_.-]+)|\b([a-z_]+(?:\.[a-z_]+)+)", message):
        key = (match.group(1) or match.group(2)).replace("-", "_").strip(".")
        if key in schema and config.origin(key) is not None:
            return config.error(key, f"TorchTitan rejected the config: {message}")
    return ConfigError(f"TorchTitan rejected the config: {message}")


# What TorchTitan takes on trust and fails on later (or trains nothing, or trains backwards):
# refused at validation. ParallelDims asserts each degree >= 1, the shard degree -1 or >= 1.
RULES: Rules = {
    **dict.fromkeys(
        (
            "training.local_batch_size", "training.seq_len", "training.steps", "model.dim",
            "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.ffn_hidden_dim",
            "model.vocab_size", "model.max_seq_len", "metrics.log_freq", "checkpoint.interval",
            "validator.freq", "training.gc_freq", "profiler.profile_freq",
            "profiler.memory_snapshot_freq", "training.max_norm", "lr_scheduler.total_steps",
            "parallelism.data_parallel_replicate_degree", "parallelism.context_parallel_degree",
            "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
            "parallelism.expert_parallel_degree", "parallelism.pipeline_parallel_microbatch_size",
        ),
        POSITIVE,
    ),
    "training.global_batch_size": positive_or_minus_one("one local batch per data-parallel rank"),
    "parallelism.data_parallel_shard_degree": positive_or_minus_one(
        "the processes the other degrees leave"
    ),
    "lr_scheduler.warmup_steps": NON_NEGATIVE,
    "lr_scheduler.decay_ratio": UNIT,
    "lr_scheduler.min_lr_factor": UNIT,
    "optimizer.lr": LEARNING_RATE,
    "optimizer.betas": FRACTION_PAIR,
    "optimizer.eps": NON_NEGATIVE,
    "optimizer.weight_decay": NON_NEGATIVE,
}  # fmt: skip


def check_params(config: ModuleConfig) -> None:
    """What TorchTitan takes on trust, or refuses only when it builds the model, checked
    without importing it (the adapter's `check_params`)."""
    config.require(RULES)
    built = "TorchTitan refuses it only when it builds the model"
    config.require_divisor("model.n_heads", "model.n_kv_heads", built)
    for heads in ("model.n_heads", "model.n_kv_heads"):
        config.require_divisor(heads, "parallelism.tensor_parallel_degree", built)


def build_trainer_config(config: ModuleConfig, owned: ParamSchema, mock_data: bool) -> Any:
    """Trainer.Config through ConfigManager (tyro), as `torchtitan.train` builds it."""
    from torchtitan.config import ConfigManager

    base = base_config(config, mock_data)
    args = ["--module", __name__, "--config", primus_base.__name__, *cli_args(config.params, owned)]
    stderr = io.StringIO()
    try:
        with _pending(base), contextlib.redirect_stderr(stderr):
            return ConfigManager().parse_args(args)
    except SystemExit as exc:  # tyro prints the problem and exits
        raise _rejected(config, stderr.getvalue() or str(exc), torchtitan_schema()) from None
    except (ValueError, AssertionError, TypeError) as exc:
        raise _rejected(config, str(exc), torchtitan_schema()) from None
