"""`primus backends list|new`."""

from __future__ import annotations

import json
from collections.abc import Sequence
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
    """Each installed backend, its upstream requirement and status, then the stages and optional
    capabilities each provides. Imports no upstream."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.backend.capabilities import CAPABILITIES

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
    _table(rows)
    features = ["pretrain", "posttrain", *CAPABILITIES]
    provided = {i.name: {*(i.stages or ()), *(i.capabilities or ())} for i in infos if i.stages}
    if provided:
        typer.echo("\nwhat each provides (primus backends list --json lists the same):")
        marks = [
            (name, *("yes" if f in has else "-" for f in features))
            for name, has in provided.items()
        ]
        _table([("backend", *features), *marks])


def _table(rows: Sequence[Sequence[str]]) -> None:
    """`rows` in columns, the last one unpadded."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)]
        typer.echo("  ".join([*cells, row[-1]]).rstrip())


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
