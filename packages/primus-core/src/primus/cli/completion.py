"""Shell completion of overrides: after a command's options, `key=value` names complete from
the keys of the experiment it names (`--config`), resolved with its presets, without importing
a framework. Commands, options and paths complete through typer (`primus
--install-completion`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer._click.core import Context  # typer's own click, vendored
from typer._click.exceptions import UsageError
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


def _bare(name: str) -> str:
    return name.lstrip("-").replace("-", "").replace("_", "").lower()


class OverridesCommand(TyperCommand):
    """A command that takes `key=value` overrides after its options, and completes them. An
    override written as one of its options misspelt (`--dry_run`, `--nproc_per_node`) is a
    usage error naming the option, not an unknown parameter of the backend."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        options = {_bare(o): o for param in self.params for o in param.opts if o.startswith("--")}
        for arg in ctx.args:
            name = arg.split("=", 1)[0]
            if name.startswith("--") and _bare(name) in options:
                raise UsageError(f"no such option: {name} (did you mean {options[_bare(name)]}?)")
        return rest

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        items = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-") or "=" in incomplete:
            return items
        config = ctx.params.get("config") or ctx.params.get("config_option")
        keys = [key for key in override_keys(config) if key.startswith(incomplete)]
        return items + [CompletionItem(f"{key}=", type="plain") for key in keys]
