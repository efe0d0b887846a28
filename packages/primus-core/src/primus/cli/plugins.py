"""Plugin commands: top-level `primus` groups that distributions add through entry points.

A distribution declares `[project.entry-points."primus.commands"] name = "module:typer_app"`.
Listing reads only metadata; a plugin's module is imported when its command is invoked, so
`primus --help` stays light and a broken plugin breaks only its own command.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

COMMANDS_GROUP = "primus.commands"
PANEL = "Plugin commands"


def _dist_name(ep: Any) -> str:
    return ep.dist.name if ep.dist is not None else "an unknown distribution"


class PluginCommand(TyperCommand):
    """Stands in for a plugin's command until it is invoked, then hands over to the real one.

    It parses nothing itself: every argument (`--help` included) goes to the plugin's command.
    """

    def __init__(self, name: str, entry_points: list[Any]) -> None:
        dists = [_dist_name(ep) for ep in entry_points]
        help_text = f"Commands from {dists[0]}"
        if len(dists) > 1:
            help_text += f" (also claimed by {', '.join(dists[1:])})"
        super().__init__(
            name,
            help=help_text,
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
            rich_help_panel=PANEL,
        )
        self.entry_points = entry_points
        self.distributions = dists

    def load(self) -> Any:
        """The plugin's click command; a PrimusError naming the distribution if it cannot load."""
        from primus.core.errors import PrimusError

        if len(self.entry_points) > 1:
            raise PrimusError(
                f"the command '{self.name}' is claimed by {' and '.join(self.distributions)}",
                hint="uninstall all but one of them",
            )
        ep, dist = self.entry_points[0], self.distributions[0]
        try:
            target = ep.load()
        except Exception as exc:  # a broken plugin fails its own command only
            raise PrimusError(
                f"the '{self.name}' command from {dist} failed to load "
                f"({ep.value}): {type(exc).__name__}: {exc}",
                hint=f"reinstall {dist}; `primus --debug {self.name} ...` shows the traceback",
            ) from exc
        if isinstance(target, typer.Typer):  # mounted like `add_typer`: always a group
            return typer.main.get_group(target)
        if isinstance(target, TyperCommand | TyperGroup):
            return target
        raise PrimusError(
            f"the '{self.name}' command from {dist}: {ep.value} is not a typer.Typer app "
            f"(got {type(target).__name__})"
        )

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        # The real command builds (and parses into) the context, so it is what gets invoked.
        return self.load().make_context(info_name, args, parent=parent, **extra)


class PrimusGroup(TyperGroup):
    """The root group: built-in commands plus plugin commands, discovered on first use.

    A plugin name that a built-in command already has is ignored, with a warning when used.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plugins_added = False
        self._shadowed: dict[str, list[str]] = {}

    def _add_plugins(self) -> None:
        if self._plugins_added:
            return
        self._plugins_added = True
        import importlib_metadata

        by_name: dict[str, list[Any]] = {}
        for ep in importlib_metadata.entry_points(group=COMMANDS_GROUP):
            by_name.setdefault(ep.name, []).append(ep)
        for name, eps in sorted(by_name.items()):
            if name in self.commands:
                self._shadowed[name] = [_dist_name(ep) for ep in eps]
            else:
                self.commands[name] = PluginCommand(name, sorted(eps, key=_dist_name))

    def list_commands(self, ctx: Any) -> list[str]:
        self._add_plugins()
        return super().list_commands(ctx)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        self._add_plugins()
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        if name in self._shadowed:
            print(
                f"warning: ignoring the '{name}' command from "
                f"{', '.join(self._shadowed[name])}: '{name}' is a built-in command",
                file=sys.stderr,
            )
        return name, cmd, rest
