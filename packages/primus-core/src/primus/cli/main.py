"""The `primus` command. Subcommand modules import Primus internals lazily: `--help` stays light.

Installed distributions may add top-level command groups (see `primus.cli.plugins`).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from primus.cli import (
    INTERRUPTED,
    backends_cmd,
    benchmark_cmd,
    checkpoint_cmd,
    config_cmd,
    data_cmd,
    patches_cmd,
    preflight_cmd,
    projection_cmd,
    slurm_cmd,
    train,
)
from primus.cli.common import DEBUG
from primus.cli.plugins import COMMANDS_GROUP, PrimusGroup

if TYPE_CHECKING:
    from primus.core.errors import PrimusError

app = typer.Typer(
    rich_markup_mode="markdown",
    name="primus",
    help="Primus: one YAML experiment, any training backend (installed as plugins).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=PrimusGroup,
)
app.add_typer(train.app, name="train")
app.add_typer(slurm_cmd.app, name="slurm")
app.add_typer(config_cmd.app, name="config")
app.add_typer(backends_cmd.app, name="backends")
app.add_typer(patches_cmd.app, name="patches")
app.add_typer(checkpoint_cmd.app, name="checkpoint")
app.add_typer(projection_cmd.app, name="projection")
app.add_typer(benchmark_cmd.app, name="benchmark")
app.add_typer(data_cmd.app, name="data")
app.command("preflight")(preflight_cmd.preflight)


def _print_versions(value: bool) -> None:
    if not value:
        return
    import importlib_metadata

    from primus.core.backend.discovery import BACKENDS_GROUP
    from primus.core.patches.registry import PATCHES_GROUP

    groups = {BACKENDS_GROUP, PATCHES_GROUP, COMMANDS_GROUP}
    for dist in sorted(importlib_metadata.distributions(), key=lambda d: d.name):
        if dist.name.startswith("primus") or groups & {ep.group for ep in dist.entry_points}:
            typer.echo(f"{dist.name} {dist.version}")
    raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_versions,
            is_eager=True,
            help="Print every installed Primus distribution.",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    if debug:
        DEBUG.on = True


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command, built once a process (tests call `main` many times), each of its
    commands' EOFErrors kept (`_eof_kept`)."""
    command = typer.main.get_command(app)
    _eof_kept(command)
    return command


def _eof_kept(command: Any) -> None:
    """Typer takes an EOFError for the end of the user's input: it prints "Aborted." and drops
    it. One from inside a command (a helper's pipe that closed, a truncated pickle) is raised
    as a RuntimeError whose cause it is, so that its traceback is told."""
    for sub in getattr(command, "commands", {}).values():
        _eof_kept(sub)
    callback = command.callback
    if callback is None:
        return

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except EOFError as exc:
            raise RuntimeError(f"the command ended on {exc!r}") from exc

    command.callback = run


def _report(exc: PrimusError) -> NoReturn:
    """The one `error:` message (once for all the ranks of a launch) and its exit code."""
    if DEBUG.on:
        traceback.print_exc()
    from primus.core.launch.launcher import report_once

    # Taking the report and printing it are one step: the launcher stops the other workers
    # with SIGTERM once one fails, and a worker stopped in between would take it unprinted.
    stop = {signal.SIGTERM, signal.SIGINT}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        if report_once(exc.report_key()):  # each rank of a launch reaches the same error
            print(f"{exc.label}: {exc}", file=sys.stderr, flush=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    sys.exit(exc.exit_code)


_told: set[str] = set()


def _background_line(what: str, exc: BaseException | None, tb: TracebackType | None) -> None:
    """`what` as one warning, once a process (a failed save's callbacks fail alike, many
    times): the traceback goes to the rank's log file, not the console."""
    from primus.core.logging import get_logger

    line = f"{what}: {type(exc).__name__}: {exc}"
    if line in _told:
        return
    _told.add(line)
    logger = get_logger()
    if logger.handlers:
        logger.warning(line, exc_info=(type(exc), exc, tb) if exc is not None else None)
    else:
        print(f"[primus] {line}", file=sys.stderr)


@functools.cache
def _quiet_background_errors() -> None:
    """Without --debug, an exception that ends a background thread, one Python can only ignore
    (an upstream's coroutine or callback left behind by a failed save), or one asyncio finds
    never retrieved (a failed save's future collected) is one line, not a traceback: the run's
    own error is the message that counts. The rank's log file has the tracebacks."""
    import logging

    from primus.core.logging import LogRouter

    LogRouter("asyncio", level=logging.WARNING).attach("asyncio")
    ignored, thread_ended = sys.unraisablehook, threading.excepthook

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):  # a Ctrl-C that reached a clean-up
            return
        if DEBUG.on:
            ignored(info)
        elif not sys.is_finalizing():  # the interpreter's own teardown: nothing to say
            where = f" in {info.object!r}" if info.object is not None else ""
            _background_line(f"ignored{where}", info.exc_value, info.exc_traceback)

    def thread(args: threading.ExceptHookArgs) -> None:
        if DEBUG.on or args.exc_type is SystemExit:
            thread_ended(args)
        else:
            name = args.thread.name if args.thread else "a thread"
            _background_line(f"{name} ended", args.exc_value, args.exc_traceback)

    sys.unraisablehook, threading.excepthook = unraisable, thread


def _after_another_worker(exc: BaseException) -> NoReturn:
    """A worker's failure that followed another worker's end (a collective whose peer is gone):
    one line, its traceback in the rank's log file, and this worker ends as the launcher's stop
    would end it (SIGTERM), so that the launcher names the worker that ended first."""
    from primus.core.logging import get_logger

    said = next(iter(str(exc).splitlines()), "").split(". ")[0][:160]
    rank = os.environ.get("RANK", "?")
    line = f"rank {rank} stopped: another rank ended first ({type(exc).__name__}: {said})"
    logger = get_logger()
    if logger.handlers:
        logger.warning(line, exc_info=exc)
    else:
        print(f"[primus] {line}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    from primus.core.reliability.preemption import end_by

    end_by(signal.SIGTERM)


def _by_ctrl_c(exc: SystemExit) -> bool:
    """The exit is typer's for a KeyboardInterrupt nothing handled: an Exit(130) whose cause
    is the interrupt (a command that handled it, saying so, raised its Exit from None)."""
    exit_ = exc.__context__
    return exit_ is not None and isinstance(exit_.__cause__, KeyboardInterrupt)


def _checked_arguments(args: list[str]) -> None:
    """ConfigErrors for what typer would take without a word: `--config` (`-c`) given more than
    once (it keeps the last), and an empty argument ('' or blanks), which a path option or
    argument reads as the current folder."""
    from primus.core.errors import ConfigError

    given = [a for a in args if a in ("--config", "-c") or a.startswith("--config=")]
    if len(given) > 1:
        raise ConfigError(f"--config is given {len(given)} times: give the experiment YAML once",
                          hint="keep one --config (overrides after it change its values)")  # fmt: skip
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        name: str | None
        if arg.startswith("--") and eq and not inline.strip():
            name = flag
        elif not arg.strip():
            name = args[i - 1] if i and args[i - 1].startswith("-") else None
        else:
            continue
        if name in ("--config", "-c"):
            raise ConfigError(f"{name} is empty: name the experiment YAML",
                              hint="e.g. --config exp.yaml")  # fmt: skip
        said = f"{name} is empty" if name else f"an empty argument after '{' '.join(args[:i])}'"
        raise ConfigError(said, hint="give it a value ('' names no path, stage or setting)")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: 0 ok, 1 failure, 2 usage or config error; tracebacks only with --debug. A
    write refused by a full, over-quota or read-only file system, however deep in a backend
    and however wrapped, is one `error:` message naming the path and the free space; memory
    that ran out, one naming the allocation."""
    DEBUG.on = os.environ.get("PRIMUS_DEBUG", "") not in ("", "0")
    if "PRIMUS_LAUNCHER_PID" in os.environ:  # a worker: die with the launcher that started it
        from primus.core.launch.launcher import bind_worker_to_launcher
        from primus.core.reliability import preemption

        bind_worker_to_launcher()
        # a stop signal passed on by the launcher while this worker starts is noted, not fatal
        preemption.watch(setting_up=True)
    from primus.core.errors import PrimusError, filesystem_error

    if argv is None:  # this process is the command (not a test calling it in its own)
        _quiet_background_errors()
    try:
        _checked_arguments(sys.argv[1:] if argv is None else argv)
        _command()(args=argv, prog_name="primus")  # exits; usage errors exit 2 (typer)
    except PrimusError as exc:
        _report(exc)
    except SystemExit as exc:
        if exc.code == 130 and _by_ctrl_c(exc):  # said here unless the command said it
            print(INTERRUPTED, file=sys.stderr, flush=True)
        raise
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # torch.distributed.checkpoint's failures are BaseExceptions
        from primus.core.reliability.out_of_memory import out_of_memory

        refused = filesystem_error(exc) or out_of_memory(exc)
        if refused is None:
            from primus.core.launch.launcher import another_worker_ended, peer_gone

            if not DEBUG.on and peer_gone(exc) and another_worker_ended():
                _after_another_worker(exc)
            raise
        _report(refused)
