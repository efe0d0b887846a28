"""Megatron's args, built with Megatron's own parser and checked with its own `validate_args`.

Params are the parser's dest names (`micro_batch_size`, `gradient_accumulation_fusion`, ...);
each value is coerced with the parser's own type, nargs and choices. Nothing reads sys.argv.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import io
import re
import traceback
import warnings
from pathlib import Path
from typing import Any

from primus.backends.megatron.config.checks import check_sequence_parallel
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.errors import ConfigError
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import get_logger

_BOOL_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse.BooleanOptionalAction,
)
_PLAIN_TYPES = (int, float, str)

# Import-time notices megatron-core prints once per missing optional package (Transformer
# Engine, Apex, absl); the adapter reports what is missing in one line instead.
_NOTICES = r".*(Transformer Engine|transformer-engine|Apex|apex|absl\.logging).*"


def silence_import_notices() -> None:
    warnings.filterwarnings("ignore", message=_NOTICES, category=UserWarning)
    warnings.filterwarnings("ignore", message="invalid escape sequence", category=SyntaxWarning)


@functools.cache
def megatron_parser() -> argparse.ArgumentParser:
    silence_import_notices()
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


@functools.cache
def megatron_actions() -> dict[str, argparse.Action]:
    """Megatron's parser actions by dest name (the first action wins a shared dest)."""
    actions: dict[str, argparse.Action] = {}
    for action in megatron_parser()._actions:
        if action.dest != "help":
            actions.setdefault(action.dest, action)
    return actions


def _choices(action: argparse.Action) -> tuple[Any, ...] | None:
    if action.choices is None:
        return None
    return tuple(c.name if isinstance(c, enum.Enum) else c for c in action.choices)


def _spec(action: argparse.Action) -> ParamSpec:
    flags = "/".join(action.option_strings)
    help_text = f"{flags}: {action.help or ''}".strip()
    default = action.default.name if isinstance(action.default, enum.Enum) else action.default
    if isinstance(action, _BOOL_ACTIONS) or action.type is bool:
        return ParamSpec(bool, help_text, default=default)
    base = action.type if action.type in _PLAIN_TYPES else (str if action.type is None else None)
    if action.nargs not in (None, "?"):
        return ParamSpec((list, base) if base else None, help_text, default=default)
    return ParamSpec(base, help_text, choices=_choices(action), default=default)


def megatron_schema() -> ParamSchema:
    """Every Megatron dest as a ParamSpec, plus hints for flag spellings that are not keys."""
    actions = megatron_actions()
    hints = {}
    for dest, action in actions.items():
        for flag in action.option_strings:
            spelled = flag.lstrip("-").replace("-", "_")
            if spelled != dest and spelled not in actions:
                if isinstance(action, _BOOL_ACTIONS):
                    value = "false" if isinstance(action, argparse._StoreFalseAction) else "true"
                else:
                    value = "<value>"
                hints[spelled] = f"{flag} is written '{dest}: {value}'"
    return ParamSchema({d: _spec(a) for d, a in actions.items()}, hints=hints)


def _coerce_one(action: argparse.Action, value: Any) -> Any:
    convert = action.type if callable(action.type) else str  # untyped options get their text
    if isinstance(value, enum.Enum):
        return value
    if convert in (int, float) and isinstance(value, int | float) and not isinstance(value, bool):
        if convert is int and value != int(value):
            raise ValueError(f"expected an integer, got {value!r}")
        return convert(value)
    return convert(value if isinstance(value, str) else str(value))


def coerce(action: argparse.Action, value: Any) -> Any:
    """`value` as Megatron's parser would produce it from the command line."""
    if value is None:
        return None
    if isinstance(action, _BOOL_ACTIONS) or action.type is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if action.nargs not in (None, "?"):
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:  # str() would make "[1, 2]" of a nested list, and pass it on
            if isinstance(item, list | tuple | dict):
                raise ValueError(f"expected a list of single values, got {value!r}")
        result: Any = [_coerce_one(action, v) for v in items]
    else:
        result = _coerce_one(action, value)
    if action.choices is not None:
        for item in result if isinstance(result, list) else [result]:
            if item not in action.choices:
                raise ValueError(f"must be one of {', '.join(map(str, _choices(action) or ()))}")
    return result


def _validation_error(exc: BaseException, config: ModuleConfig) -> ConfigError:
    """A validate_args failure as a config error at the first key its message names."""
    message = str(exc).strip()
    if not message:  # a bare assert: show the check itself
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        message = f"`{frame.line}` failed ({Path(frame.filename).name}:{frame.lineno})"
    named = [k for k in config.params if re.search(rf"\b{k}\b|--{k.replace('_', '-')}\b", message)]
    origin = config.origin(named[0]) if named else None
    return ConfigError(
        f"Megatron rejected the arguments: {message}",
        origin,
        hint="this check is Megatron's own validate_args",
    )


def model_parallel_size(args: argparse.Namespace) -> int:
    """Processes one model replica spans: tensor x pipeline x context parallel."""
    return int(
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )


def build_megatron_args(
    config: ModuleConfig, megatron_params: dict[str, Any]
) -> argparse.Namespace:
    """parse_args([]) for the defaults, the params on top, then Megatron's `validate_args`."""
    from megatron.training.arguments import validate_args

    actions = megatron_actions()
    args = megatron_parser().parse_args([])
    for key, value in megatron_params.items():  # nulls are refused by check_params
        if value is None:
            continue
        try:
            setattr(args, key, coerce(actions[key], value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise config.error(key, f"{key}: {exc}") from None
    env = get_torchrun_env()
    args.rank, args.world_size = env.rank, env.world_size
    if env.world_size == 1:  # one process (checkpoint conversion, dry run): the smallest world
        args.world_size = model_parallel_size(args)  # the layout needs; the trainer checks it
    args._is_global_batch_size_explicitly_specified = args.global_batch_size is not None
    dump = io.StringIO()
    try:
        with contextlib.redirect_stdout(dump):  # validate_args prints every arg: keep it at DEBUG
            validate_args(args, {})
    except (AssertionError, ValueError, TypeError) as exc:  # TypeError: a None it compares
        raise _validation_error(exc, config) from exc
    finally:
        get_logger("megatron").debug(dump.getvalue())
    check_sequence_parallel(config, args)
    return args
