"""Plugin commands (`primus.commands` entry points), as real subprocesses.

The plugins are real distributions: a dist-info directory with entry_points.txt and a module,
both on PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # plugin commands, as real subprocesses

HELLO = """
    import typer

    app = typer.Typer(help="Greetings from a plugin.", no_args_is_help=True)
    NOT_AN_APP = 42


    @app.callback()
    def hello() -> None:
        "Greetings from a plugin."


    @app.command()
    def greet(name: str = typer.Option("world", "--name")) -> None:
        "Say hello."
        print(f"hello {name}")
"""

PLUGINS = {
    # distribution: (entry_points.txt lines, module name, module source)
    "helloplug": (["hello = helloplug_mod:app", "notapp = helloplug_mod:NOT_AN_APP"], HELLO),
    "brokenplug": (["broken = brokenplug_mod:app"], "import no_such_dependency_anywhere\n"),
    "shadowplug": (["train = shadowplug_mod:app"], "raise RuntimeError('never imported')\n"),
    "twinplug": (["hello = twinplug_mod:app"], "raise RuntimeError('never imported')\n"),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    for dist, (entry_points, source) in PLUGINS.items():
        info = root / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[primus.commands]\n" + "\n".join(entry_points))
        (root / f"{dist}_mod.py").write_text(textwrap.dedent(source).lstrip())
    return root


def run(site: Path, *args: str, only: tuple[str, ...] | None = None) -> subprocess.CompletedProcess:
    """`python ARGS` with the plugins on PYTHONPATH (`only`: hide the other dist-infos)."""
    path = site
    if only is not None:
        path = site.parent / f"{site.name}-{'-'.join(only)}"
        if not path.exists():
            path.mkdir()
            for entry in site.iterdir():
                if not entry.name.endswith(".dist-info") or entry.name.split("-")[0] in only:
                    (path / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k not in ("PRIMUS_PATCHES", "PRIMUS_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


def primus(site: Path, *args: str, only: tuple[str, ...] | None = None):
    return run(site, "-m", "primus.cli", *args, only=only)


def test_help_lists_plugins_without_importing_them(site: Path) -> None:
    probe = textwrap.dedent("""
        import sys
        from primus.cli.main import main
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("IMPORTED", sorted(m for m in sys.modules if m.endswith("plug_mod")))
    """)
    result = run(site, "-c", probe, only=("helloplug", "brokenplug"))
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout
    assert "Plugin commands" in result.stdout
    assert "Commands from helloplug" in result.stdout
    assert "Commands from brokenplug" in result.stdout


def test_invoking_a_plugin_runs_it(site: Path) -> None:
    result = primus(site, "hello", "greet", "--name", "Ada", only=("helloplug",))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello Ada\n"
    helped = primus(site, "hello", "--help", only=("helloplug",))
    assert helped.returncode == 0 and "greet" in helped.stdout and "Say hello." in helped.stdout


def test_a_broken_plugin_fails_alone_with_a_clean_error(site: Path) -> None:
    broken = primus(site, "broken", "anything", "--flag")
    assert broken.returncode == 1
    assert broken.stderr.startswith(
        "error: the 'broken' command from brokenplug failed to load (brokenplug_mod:app): "
        "ModuleNotFoundError: No module named 'no_such_dependency_anywhere'"
    ), broken.stderr
    assert "Traceback" not in broken.stderr
    debug = primus(site, "--debug", "broken")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    not_an_app = primus(site, "notapp", only=("helloplug",))
    assert not_an_app.returncode == 1
    assert "helloplug_mod:NOT_AN_APP is not a typer.Typer app (got int)" in not_an_app.stderr
    listed = primus(site, "backends", "list")
    assert listed.returncode == 0 and "dummy" in listed.stdout


def test_name_clashes(site: Path) -> None:
    shadowed = primus(site, "train", "--help", only=("shadowplug",))
    assert shadowed.returncode == 0, shadowed.stderr
    assert shadowed.stderr == (
        "warning: ignoring the 'train' command from shadowplug: 'train' is a built-in command\n"
    )
    assert "pretrain" in shadowed.stdout
    twins = primus(site, "hello", "greet", only=("helloplug", "twinplug"))
    assert twins.returncode == 1
    assert "'hello' is claimed by helloplug and twinplug" in twins.stderr
