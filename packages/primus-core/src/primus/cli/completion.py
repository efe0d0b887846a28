"""Shell completion of overrides: after a command's options, `key=value` names complete from
the keys of the experiment it names (`--config`), resolved with its presets, without importing
a framework. Commands, options and paths complete through typer (`primus
--install-completion`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer._click.core import Context  # typer's own click, vendored
from typer._click.shell_completion import CompletionItem
from typer.core import TyperCommand


def override_keys(config: Any) -> list[str]:
    """The dotted keys of every module of the experiment in `config`; none when it does not
    load (a completion never fails)."""
    from primus.core.runtime import resolution

    if not isinstance(config, Path | str) or not Path(config).is_file():
        return []
    try:
        experiment = resolution.load(Path(config))
    except Exception:
        return []
    return sorted(
        {
            ".".join(path)
            for module in experiment.modules.values()
            for path, _ in module.tree.leaves()
        }
    )


class OverridesCommand(TyperCommand):
    """A command that takes `key=value` overrides after its options, and completes them."""

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        items = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-") or "=" in incomplete:
            return items
        config = ctx.params.get("config") or ctx.params.get("config_option")
        keys = [key for key in override_keys(config) if key.startswith(incomplete)]
        return items + [CompletionItem(f"{key}=", type="plain") for key in keys]
