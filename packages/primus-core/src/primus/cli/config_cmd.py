"""`primus config show|validate`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import OVERRIDES, Debug, Module
from primus.cli.completion import OverridesCommand

app = typer.Typer(
    rich_markup_mode="markdown", help="Inspect and check experiment configs.", no_args_is_help=True
)
ConfigArg = Annotated[
    Path | None, typer.Argument(help="The experiment YAML (or --config).", show_default=False)
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="The experiment YAML, as `train` takes it.", show_default=False
    ),
]


def _experiment_file(ctx: typer.Context, argument: Path | None, option: Path | None) -> Path:
    """The experiment YAML, given as the argument or with --config. With --config, a first
    override (`config show --config exp.yaml lr=0.1`) lands in the argument's place: it goes
    back to the overrides."""
    if argument is not None and option is not None and "=" in str(argument):
        ctx.args.insert(0, str(argument))
        return option
    if (argument is None) == (option is None):
        raise typer.BadParameter("give the experiment YAML once: as an argument or with --config")
    return argument or option  # type: ignore[return-value]


class Format(StrEnum):
    yaml = "yaml"
    json = "json"


@app.command(cls=OverridesCommand, context_settings=OVERRIDES)
def show(
    ctx: typer.Context,
    config: ConfigArg = None,
    config_option: ConfigOpt = None,
    module: Module = None,
    provenance: Annotated[
        bool,
        typer.Option("--provenance", help="Say where every value came from and what it overrode."),
    ] = False,
    after_patches: Annotated[
        bool,
        typer.Option(
            "--after-patches",
            help="Apply the setup and build_args patches first, as a dry run does (validates, "
            "imports the backend), and show the values they set (origin `patch <id>`).",
        ),
    ] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.yaml,
    debug: Debug = False,
) -> None:
    """Print the resolved experiment (presets, overrides and CLI applied). Does not validate,
    unless --after-patches."""
    from primus.core.config.experiment import resolved_tree
    from primus.core.config.render import to_json, to_yaml
    from primus.core.runtime import resolution

    config = _experiment_file(ctx, config, config_option)
    if after_patches:
        from primus.core.runtime.primus_runtime import PrimusRuntime

        tree = PrimusRuntime(config, list(ctx.args), module=module, debug=debug).patched_config()
    else:
        tree = resolved_tree(resolution.load(config, list(ctx.args), module))
    typer.echo(
        to_json(tree, provenance) if fmt is Format.json else to_yaml(tree, provenance), nl=False
    )
    if fmt is Format.json:
        typer.echo()


@app.command(cls=OverridesCommand, context_settings=OVERRIDES)
def validate(
    ctx: typer.Context,
    config: ConfigArg = None,
    config_option: ConfigOpt = None,
    module: Module = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage",
            help="The stage to check, as `train STAGE --dry-run` would "
            "(default: posttrain for a module with sft: or peft:, else pretrain).",
            show_default=False,
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Also run what needs the framework imported, as `train --dry-run` does: the "
            "patches, the backend's own cross-field validation, the trainer class (seconds "
            "more).",
        ),
    ] = False,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node",
            min=1,
            help="Check the parallel layout and the batch against this many processes per "
            "node, as `train` would start them (default: not checked).",
            show_default=False,
        ),
    ] = None,
    nnodes: Annotated[
        int | None,
        typer.Option("--nnodes", min=1, help="Nodes, with --nproc-per-node.", show_default=False),
    ] = None,
    debug: Debug = False,
) -> None:
    """Check an experiment without importing the framework, writing nothing: the workspace, the
    files it reads, every key against the backend's schema (kept in the user cache per
    framework version), the backend's own checks of values, and, given --nproc-per-node or
    --nnodes, the parallel layout and the batch against the processes `train` would start.
    Exit 0 if valid, 2 if not."""
    from primus.core.errors import ConfigError
    from primus.core.runtime import resolution
    from primus.core.runtime.primus_runtime import PrimusRuntime

    config = _experiment_file(ctx, config, config_option)
    overrides = list(ctx.args)
    experiment = resolution.load(config, overrides, module)
    for note in experiment.notes:
        typer.echo(f"warning: {note}", err=True)
    for name, mod in experiment.modules.items():
        step = stage if stage is not None else ("posttrain" if mod.sft or mod.peft else "pretrain")
        try:
            runtime = PrimusRuntime(config, overrides, step, name, debug=debug, check_inputs=True)
            if nproc_per_node or nnodes:  # the launch is known: check it as `train` will
                nodes, procs = nnodes or 1, nproc_per_node or 1
                runtime.check_world(nodes * procs, f"--nnodes {nodes} x --nproc-per-node {procs}")
            runtime.validate(full)
        except ConfigError as exc:  # without a line to point at, say which module it is
            if len(experiment.modules) > 1 and not (exc.origin and str(exc.origin)):
                exc.message = f"module '{name}': {exc.message}"
            raise
        typer.echo(f"ok: module '{name}' ({mod.framework}): {len(list(mod.tree.leaves()))} params")
    typer.echo(f"{config}: valid")
