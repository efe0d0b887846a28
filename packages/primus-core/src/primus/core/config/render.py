"""Printing a resolved config as YAML (with provenance comments) or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import yaml

from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import KeyPath, PrimusDumper


def _scalar(value: Any) -> str:
    text = yaml.dump(value, Dumper=PrimusDumper, default_flow_style=True, width=1 << 30)
    return text.removesuffix("\n").removesuffix("\n...").removesuffix("...").strip()


def provenance_of(tree: ConfigTree, path: KeyPath) -> str:
    """'file:line', plus what the value overrode: 'b.yaml:3 (overrode 1000 from a.yaml:7)'."""
    origin = tree.origin(path)
    text = str(origin) if origin else "unknown"
    replaced = tree.replaced.get(path)
    if replaced:
        older = "; ".join(f"{_scalar(v)} from {o}" for v, o in reversed(replaced))
        text += f" (overrode {older})"
    return text


def to_yaml(tree: ConfigTree, provenance: bool = False) -> str:
    lines: list[str] = []

    def emit(node: dict[str, Any], prefix: KeyPath, indent: str) -> None:
        for key, value in node.items():
            path = (*prefix, key)
            if isinstance(value, dict) and value:
                lines.append(f"{indent}{_scalar(key)}:")
                emit(value, path, indent + "  ")
                continue
            comment = f"  # {provenance_of(tree, path)}" if provenance else ""
            lines.append(f"{indent}{_scalar(key)}: {_scalar(value)}{comment}")

    emit(tree.data, (), "")
    return "\n".join(lines) + "\n"


def _strict_json(value: Any) -> str:
    """JSON that every reader takes: a NaN or an infinity (YAML's .nan, .inf) as its YAML text
    in a string, since JSON has no such number."""

    def plain(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return _scalar(item)
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        return [plain(v) for v in item] if isinstance(item, list | tuple) else item

    return json.dumps(plain(value), indent=2, default=str, allow_nan=False)


def to_json(tree: ConfigTree, provenance: bool = False) -> str:
    if not provenance:
        return _strict_json(tree.data)
    sources = {}
    for path, _ in tree.leaves():
        origin = tree.origin(path)
        entry: dict[str, Any] = {"source": str(origin) if origin else None}
        if path in tree.replaced:
            entry["overrode"] = [{"value": v, "source": str(o)} for v, o in tree.replaced[path]]
        sources[".".join(path)] = entry
    return _strict_json({"config": tree.data, "provenance": sources})


def args_summary(args: Any) -> str:
    """Backend args as YAML, whatever their type (namespace, dataclass, dict); a dataclass's
    fields declared with `repr=False` are left out."""
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        hidden = {f.name for f in dataclasses.fields(args) if not f.repr}
        data = {k: v for k, v in dataclasses.asdict(args).items() if k not in hidden}
    elif isinstance(args, dict):
        data = args
    else:
        data = vars(args) if hasattr(args, "__dict__") else {"args": args}

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        plain_types = (str, int, float, bool, type(None))  # exact: an IntEnum is shown by repr
        return value if type(value) in plain_types else repr(value)

    return yaml.safe_dump(plain(data), sort_keys=True, width=100)
