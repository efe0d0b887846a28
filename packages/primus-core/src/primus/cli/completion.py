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
    """The dotted keys of every module of the experiment in `config`, and every key of its
    backend's schema where the cache holds it (`config validate` fills the cache); none when
    the experiment does not load (a completion never fails)."""
    from primus.core.config.schema_cache import cached_schema
    from primus.core.runtime import resolution

    if not isinstance(config, Path | str) or not Path(config).is_file():
        return []
    try:
        experiment = resolution.load(Path(config))
    except Exception:
        return []
    modules = experiment.modules.values()
    keys = {".".join(path) for module in modules for path, _ in module.tree.leaves()}
    for framework in {module.framework for module in modules}:
        try:
            schema = cached_schema(resolution.adapter_class(framework)(framework))
        except Exception:  # a backend that does not load: the experiment's keys only
            schema = None
        keys.update(schema.specs if schema is not None else ())
    return sorted(keys)


class OverridesCommand(TyperCommand):
    """A command that takes `key=value` overrides after its options, and completes them."""

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        items = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-") or "=" in incomplete:
            return items
        config = ctx.params.get("config") or ctx.params.get("config_option")
        keys = [key for key in override_keys(config) if key.startswith(incomplete)]
        return items + [CompletionItem(f"{key}=", type="plain") for key in keys]
