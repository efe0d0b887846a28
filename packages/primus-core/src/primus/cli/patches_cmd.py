"""`primus patches list|show`: the live inventory of registered patches."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

app = typer.Typer(
    rich_markup_mode="markdown", help="The patches layered over each backend.", no_args_is_help=True
)


class Format(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"


def _load() -> None:
    from primus.core.patches.registry import load_patch_modules

    for failure in load_patch_modules():
        print(
            f"warning: patch module {failure.entry_point} ({failure.distribution}) failed to "
            f"import: {failure.error}",
            file=sys.stderr,
        )


@app.command("list")
def list_patches(
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend's.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Every registered patch: id, what it does, target, location, how to enable, phase."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.errors import ConfigError, did_you_mean
    from primus.core.patches.inventory import render
    from primus.core.patches.registry import all_patches

    _load()
    known = {p.backend for p in all_patches()} | set(BackendRegistry.backends())
    if backend is not None and backend not in known:
        raise ConfigError(f"--backend {backend}: no such backend{did_you_mean(backend, known)}",
                          hint="`primus backends list` shows the installed ones")  # fmt: skip
    typer.echo(render(all_patches(backend), fmt.value))


@app.command()
def show(patch_id: Annotated[str, typer.Argument(metavar="ID", help="A patch id.")]) -> None:
    """One patch in depth, with a porting plan generated from its metadata."""
    from primus.core.errors import ConfigError, did_you_mean
    from primus.core.patches.inventory import deep_dive
    from primus.core.patches.registry import all_patches, get_patch

    _load()
    patch = get_patch(patch_id)
    if patch is None:
        ids = [p.id for p in all_patches()]
        raise ConfigError(
            f"no patch '{patch_id}'{did_you_mean(patch_id, ids)}",
            hint="`primus patches list` shows every patch",
        )
    typer.echo(deep_dive(patch), nl=False)
