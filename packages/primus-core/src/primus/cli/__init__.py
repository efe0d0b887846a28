"""The `primus` command (`primus.cli.main`).

A Ctrl-C while Python imports the command, before the command can handle one, ends it with one
line instead of a traceback (Python then ends the process by SIGINT: exit 130); with `--debug`
or PRIMUS_DEBUG, the traceback.
"""

import os
import sys
from types import TracebackType

INTERRUPTED = "[primus] interrupted (Ctrl-C)"  # the line for a Ctrl-C nothing else handled
_hook = sys.excepthook


def _interrupted(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    debug = os.environ.get("PRIMUS_DEBUG", "") not in ("", "0") or "--debug" in sys.argv
    if issubclass(kind, KeyboardInterrupt) and not debug:
        print(INTERRUPTED, file=sys.stderr, flush=True)
    else:
        _hook(kind, value, tb)


sys.excepthook = _interrupted
