"""Constants of an installed upstream read from its source, without importing it: a command
that needs one default value (a preset derived from an HF config.json) answers in a second
instead of after the upstream's and torch's import. Each caller keeps the import as the
fallback, and its backend's tests compare both."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import Any

Node = ast.Module | ast.ClassDef | ast.FunctionDef


def _child(node: Node, name: str) -> Node | None:
    for item in node.body:
        if isinstance(item, ast.ClassDef | ast.FunctionDef) and item.name == name:
            return item
    return None


def _defaults(node: Node) -> dict[str, ast.expr]:
    """A function's keyword defaults, or a class's field defaults (`name: type = value`)."""
    if isinstance(node, ast.FunctionDef):
        args = node.args.args[len(node.args.args) - len(node.args.defaults) :]
        named = dict(zip((a.arg for a in args), node.args.defaults, strict=True))
        return named | {
            a.arg: d
            for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
            if d is not None
        }
    return {
        item.target.id: item.value
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value
    }


@functools.cache
def source_defaults(package: str, module_file: str, owner: str) -> dict[str, Any] | None:
    """The literal defaults of `owner` ("Class.method", "function" or "Outer.Config" for a
    class's fields) in `module_file` (relative to the installed top-level `package`), read
    without importing anything of the package; None when the source or owner is not found."""
    spec = importlib.util.find_spec(package)  # a top-level package is found, not imported
    for folder in (spec.submodule_search_locations or []) if spec else []:
        source = Path(folder) / module_file
        if not source.is_file():
            continue
        node: Node | None = ast.parse(source.read_text(encoding="utf-8"))
        for name in owner.split("."):
            node = _child(node, name) if node is not None else None
        if node is None:
            return None
        found = {}
        for name, value in _defaults(node).items():
            try:
                found[name] = ast.literal_eval(value)
            except ValueError:
                continue  # not a literal: left out
        return found
    return None
