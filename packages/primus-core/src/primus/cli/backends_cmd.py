"""`primus backends list|new`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    rich_markup_mode="markdown", help="Installed training backends.", no_args_is_help=True
)


@app.command("list")
def list_backends(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Each installed backend, its upstream requirement and status. Imports no upstream."""
    from primus.core.backend.backend_registry import BackendRegistry

    infos = sorted(BackendRegistry.backends().values(), key=lambda i: i.name)
    if as_json:
        typer.echo(json.dumps([i.as_dict() for i in infos], indent=2))
        return
    if not infos:
        typer.echo(
            "no backends installed (install a backend package: pip install primus-<backend>)"
        )
        return
    rows = [("backend", "distribution", "upstream requirement", "installed", "status")]
    for i in infos:
        status = i.status + (f": {i.reason}" if i.reason else "")
        rows.append(
            (
                i.name,
                f"{i.distribution or '(in-process)'} {i.version or ''}".strip(),
                i.upstream_requirement or "-",
                i.upstream_version or "-",
                status,
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for row in rows:
        typer.echo(
            "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)) + "  " + row[4]
        )


@app.command("new")
def new_backend(
    name: Annotated[str, typer.Argument(help="The backend's name, as `framework:` will say it.")],
    folder: Annotated[
        Path | None,
        typer.Option("--dir", help="Where to write it (default: ./primus-backend-NAME)."),
    ] = None,
) -> None:
    """Write a new backend distribution: entry points, adapter, trainer, presets, an example
    experiment and a conformance test. It trains a toy model as soon as it is installed."""
    from primus.core.backend.scaffold import scaffold_backend

    target = folder or Path(f"primus-backend-{name}")
    files = scaffold_backend(name, target)
    typer.echo(f"wrote {len(files)} files into {target}/; next:")
    typer.echo(f"  pip install -e '{target}[test]'  # the test extra: primus-testing")
    typer.echo(f"  primus train pretrain --config {target}/examples/{name}_tiny-pretrain.yaml")
    typer.echo(f"  pytest {target}/tests")
