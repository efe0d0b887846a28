"""Command-line overrides: `key=value`, `--key value`, `--key=value`, dotted keys, YAML-typed values."""

from __future__ import annotations

import re
from typing import Any

from primus.core.config.yaml_io import KeyPath, parse_scalar
from primus.core.errors import ConfigError, Origin

_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w.\-]*=")


def _key(raw: str, token: str) -> KeyPath:
    parts = tuple(p.replace("-", "_") for p in raw.split("."))
    if not all(parts):
        raise ConfigError(f"bad override key in '{token}'", Origin("cli", detail=token))
    return parts


def parse_overrides(tokens: list[str]) -> list[tuple[KeyPath, Any, Origin]]:
    """Turn override tokens into (key path, typed value, origin) in command-line order.

    A `--flag` with no value (last, or followed by another `--option` or a `key=value`) means
    `true`; write `--name=a=b` for a value that looks like an assignment.
    Dashes in keys become underscores: `--train-iters 10` sets `train_iters`.
    """
    result: list[tuple[KeyPath, Any, Origin]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--"):
            body = token[2:]
            if "=" in body:
                raw, value = body.split("=", 1)
            elif (
                i + 1 < len(tokens)
                and not tokens[i + 1].startswith("--")
                and not _ASSIGNMENT.match(tokens[i + 1])
            ):
                raw, value = body, tokens[i + 1]
                token = f"{token} {value}"
                i += 1
            else:
                raw, value = body, "true"
        elif "=" in token and not token.startswith("-"):
            raw, value = token.split("=", 1)
        else:
            raise ConfigError(
                f"cannot read override '{token}'",
                hint="write overrides as key=value, --key value or --key=value",
            )
        where = Origin("cli", detail=token)
        result.append((_key(raw, token), parse_scalar(value, where), where))
        i += 1
    return result


def repeated(parsed: list[tuple[KeyPath, Any, Origin]]) -> list[str]:
    """A note for each key `parse_overrides` gave more than once: the last value is the one used."""
    given: dict[KeyPath, list[str]] = {}
    for keypath, _, origin in parsed:
        given.setdefault(keypath, []).append(origin.detail or "")
    return [
        f"{'.'.join(key)} is given {len(tokens)} times on the command line "
        f"({', '.join(repr(t) for t in tokens)}): the last one is used"
        for key, tokens in given.items()
        if len(tokens) > 1
    ]
