"""MaxText's config from Primus params, through MaxText's own `pyconfig`.

Every param that is not Primus's own becomes a `key=value` argument after the base config the
wheel ships (`maxtext/configs/base.yml`): exactly the command line of
`python -m maxtext.trainers.pre_train.train <base.yml> key=value ...`. pyconfig merges and
validates it with MaxText's pydantic model (`MaxTextConfig`); the schema is that model's fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from primus.backends.maxtext.config.checks import (
    check_eval,
    check_peft,
    check_uploads,
    param_values,
)
from primus.backends.maxtext.config.mesh import LAYOUT_KEY, check_unspecified, ici_axes
from primus.backends.maxtext.config.rules import RULES, mesh_rules
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.errors import ConfigError, Origin

if TYPE_CHECKING:
    from pydantic import ValidationError

_SCALARS = (bool, int, float, str)


@dataclass
class MaxTextArgs:
    """What the trainer runs: MaxText's command line, the config it resolves to (flat), the
    params Primus's own patches take (not MaxText's, so not in `argv`), and where the params
    the trainer's device checks name were set (the mesh's, per_device_batch_size)."""

    argv: list[str]
    config: dict[str, Any]
    primus: dict[str, Any] = dataclasses.field(default_factory=dict)
    origins: dict[str, Origin] = dataclasses.field(default_factory=dict, repr=False)


def base_config() -> str:
    """The base config shipped in the maxtext wheel (found without importing maxtext)."""
    return str(resources.files("maxtext") / "configs" / "base.yml")


def _kind(annotation: Any) -> tuple[type | tuple[type, ...] | None, tuple[Any, ...] | None]:
    """(type, choices) that a config value of this annotation must have; None: not checked."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return type(values[0]), values
    if origin in (typing.Union, types.UnionType):
        kinds = [_kind(a) for a in typing.get_args(annotation) if a is not type(None)]
        flat: list[type] = []
        for kind, _ in kinds:
            if kind is None:
                return None, None
            flat += [t for t in (kind if isinstance(kind, tuple) else (kind,)) if t not in flat]
        choices = [c for _, c in kinds]
        merged = None if None in choices else tuple(v for c in choices for v in c or ())
        return (flat[0] if len(flat) == 1 else tuple(flat)), merged
    if origin in (list, tuple) or annotation in (list, tuple):
        return list, None
    if origin is dict or annotation is dict or hasattr(annotation, "model_fields"):
        return dict, None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = tuple(member.value for member in annotation)
        return type(values[0]), values
    return (annotation, None) if annotation in _SCALARS else (None, None)


# the policies MaxText's decoder takes (NNXDecoder.get_remat_policy; `remat_policy` is typed
# str, and another name failed its assertion at the first step, after start-up)
REMAT_POLICIES = (
    "none", "full", "minimal", "minimal_with_context", "minimal_flash",
    "minimal_with_quantization", "minimal_with_context_and_quantization",
    "save_dot_with_context_except_mlp", "save_dot_except_mlpwi", "save_dot_except_mlp",
    "save_qkv_proj", "qkv_proj_offloaded", "minimal_offloaded", "custom", "save_out_proj",
)  # fmt: skip


@cache
def maxtext_schema() -> ParamSchema:
    """Every key of MaxText's `MaxTextConfig`, typed from its annotations, with its default
    (a default factory's list or mapping too, as `mesh_axes`'s; never a sub-model)."""
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    from maxtext.configs.types import MaxTextConfig

    specs = {}
    for name, field in MaxTextConfig.model_fields.items():
        kind, choices = _kind(field.annotation)
        choices = REMAT_POLICIES if name == "remat_policy" else choices
        default = field.get_default(call_default_factory=True)
        default = (
            None if default is PydanticUndefined or isinstance(default, BaseModel) else default
        )
        default = default.value if isinstance(default, enum.Enum) else default
        nullable = kind is None or _admits_none(field.annotation)
        specs[name] = ParamSpec(kind, (field.description or "").strip(), choices, default,
                                nullable=nullable)  # fmt: skip
    return ParamSchema(specs)


def _admits_none(annotation: Any) -> bool:
    """Whether pydantic takes None for a field of this annotation (Optional, Any, None)."""
    if annotation in (Any, None, type(None)):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _admits_none(typing.get_args(annotation)[0])
    return origin in (typing.Union, types.UnionType) and any(
        map(_admits_none, typing.get_args(annotation))
    )


def _value(value: Any) -> str:
    """A value as MaxText's command line takes it (OmegaConf reads it back as YAML)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text.removesuffix("\n...").strip()


def maxtext_argv(params: dict[str, Any], owned: ParamSchema) -> list[str]:
    """MaxText's argv (`["", base.yml, "key=value", ...]`) for every param not in `owned`."""
    pairs = [f"{key}={_value(value)}" for key, value in params.items() if key not in owned]
    return ["", base_config(), *pairs]


def _rejected(config: ModuleConfig, message: str) -> ConfigError:
    """A ConfigError at the first param MaxText's message names (the user's spelling)."""
    message = " ".join(message.split())
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if word in config.params and config.origin(word) is not None:
            return config.error(word, f"MaxText rejected the config: {message}")
    return ConfigError(f"MaxText rejected the config: {message}")


def _pydantic_message(exc: ValidationError) -> tuple[str | None, str]:
    """(the key of pydantic's first error, its message)."""
    error = exc.errors()[0]
    key = str(error["loc"][0]) if error.get("loc") else None
    text = error["msg"].removeprefix("Value error, ") + (
        f" (got {error['input']!r})" if key and "input" in error else ""
    )
    return key, f"{key}: {text}" if key else text


@contextlib.contextmanager
def rejections_as_config_errors(config: ModuleConfig) -> Iterator[None]:
    """MaxText's validation errors (pydantic's, and any other its config code raises) become
    ConfigErrors; wrap only the config building."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        key, message = _pydantic_message(exc)
        if key in config.params and config.origin(key) is not None:
            raise config.error(key, f"MaxText rejected the config: {message}") from None
        raise _rejected(config, message) from None
    except Exception as exc:  # pyconfig itself treats any exception as a config error
        raise _rejected(config, str(exc) or type(exc).__name__) from None
    except SystemExit as exc:  # pyconfig exits when the maxtext.config_errors patch is off
        raise ConfigError(
            "MaxText rejected the config (its message is in the log above)",
            hint="enable the maxtext.config_errors patch to see it here",
        ) from exc


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """absl at WARNING: MaxText's INFO notes come once, when the trainer builds the config."""
    from absl import logging as absl_logging

    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        yield
    finally:
        absl_logging.set_verbosity(verbosity)


def check_params(config: ModuleConfig, schema: ParamSchema) -> None:
    """What MaxText takes on trust, or refuses only when it builds the model, checked without
    importing it (the adapter's `check_params`; `schema` gives MaxText's defaults)."""
    config.require(RULES | mesh_rules(schema))
    config.require_divisor(
        "base_num_query_heads", "base_num_kv_heads", "MaxText fails only when it builds the model"
    )
    value = param_values(config, schema)
    axes = ici_axes(value, schema)
    if axes is not None:
        check_unspecified(config, axes)
    steps, schedule = value("steps"), value("learning_rate_schedule_steps")
    if steps == -1 and schedule == -1:
        raise config.error(
            "steps",
            "steps is -1 (the schedule's length) and so is learning_rate_schedule_steps: "
            "no run length is set",
            hint="set steps to a positive number",
        )
    sft = config.sft
    if sft is not None and sft.packing and value("attention") == "cudnn_flash_te":
        raise sft.error(
            "packing",
            "maxtext: packed rows are masked per sample through decoder_segment_ids, "
            "which Primus has not tested with attention: cudnn_flash_te",
            hint="set attention: autoselected (or dot_product, flash), or sft.packing: false",
        )
    check_peft(config, value)
    check_eval(config, value)
    check_uploads(config, value)


def build_config(config: ModuleConfig, owned: ParamSchema, **extra: Any) -> MaxTextArgs:
    """Resolve and validate MaxText's config as its training entry point does (with `extra`
    keys the adapter adds)."""
    from maxtext.configs import pyconfig
    from maxtext.utils import train_utils

    argv = maxtext_argv(config.params | extra, owned)
    with rejections_as_config_errors(config), _quiet():
        resolved = pyconfig.initialize_pydantic(argv)
        train_utils.validate_train_config(pyconfig.HyperParameters(resolved))
    primus = {key: value for key, value in config.params.items() if key in owned}
    named = (k for k in config.params if LAYOUT_KEY.fullmatch(k) or k == "per_device_batch_size")
    origins = {key: where for key in named if (where := config.origin(key)) is not None}
    return MaxTextArgs(argv, resolved.model_dump(mode="json"), primus, origins)
