"""Options and state shared by the subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


class _Debug:
    on = False


DEBUG = _Debug()

# Overrides (key=value, --key value) arrive as extra arguments.
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}

ConfigFile = Annotated[
    Path, typer.Option("--config", "-c", help="The experiment YAML.", show_default=False)
]
Module = Annotated[
    str | None, typer.Option("--module", help="The module to use when the experiment has several.")
]


def debug_option(value: bool) -> None:
    if value:
        DEBUG.on = True


Debug = Annotated[
    bool,
    typer.Option("--debug", callback=debug_option, help="Show tracebacks and log at DEBUG level."),
]
