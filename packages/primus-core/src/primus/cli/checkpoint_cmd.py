"""`primus checkpoint preset|inspect`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import Debug

app = typer.Typer(
    help="Checkpoints: Hugging Face model directories and each backend's native format.",
    no_args_is_help=True,
)


@app.command()
def preset(
    hf: Annotated[
        Path,
        typer.Option(
            "--hf",
            help="A Hugging Face model directory (its config.json is read).",
            show_default=False,
        ),
    ],
    framework: Annotated[
        str | None,
        typer.Option(
            "--framework", help="The backend whose preset to write (default: the only ready one)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the YAML here (default: stdout).")
    ] = None,
    debug: Debug = False,
) -> None:
    """Derive a backend's model preset from an HF config.json (shapes, norms, RoPE, MoE), so
    architecture numbers are never copied by hand. Unsupported fields are named (exit 2)."""
    from primus.core.checkpoint.preset import derive_preset, pick_framework

    text = derive_preset(hf, pick_framework(framework))
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text)
    typer.echo(f"wrote {out}")


@app.command()
def inspect(
    path: Annotated[
        Path,
        typer.Argument(help="A checkpoint folder (HF or a backend's native).", show_default=False),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    debug: Debug = False,
) -> None:
    """Say what a checkpoint is: format, backend, iteration, model shape, parallel layout,
    size, and the Primus run that wrote it. HF directories are read from their file headers;
    native formats are recognised by the installed backends."""
    from primus.core.checkpoint.inspect import inspect_checkpoint, render

    info = inspect_checkpoint(path)
    typer.echo(json.dumps(info, indent=2) if as_json else "\n".join(render(info)))
