"""What the operating system allows a config: `env:` values a process can be given, and run
directory names that are one folder each."""

from __future__ import annotations

import re
from typing import Any

from primus.core.config.tree import ConfigTree
from primus.core.errors import ConfigError, clipped

ENV_MAX = 32 * 4096  # bytes of one NAME=value string that a new process may be given
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(exp: ConfigTree) -> None:
    """`env:` names are variable names; values are strings, numbers or booleans."""
    for name, value in (exp.data.get("env") or {}).items():
        where = exp.origin(("env", name))
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"env: '{name}' is not an environment variable name", where)
        if isinstance(value, dict | list):
            raise ConfigError(
                f"env.{name}: must be a string, number or boolean, got {type(value).__name__}",
                where,
            )
        if len(f"{name}={value}".encode()) > ENV_MAX:
            raise ConfigError(
                f"env.{name}: over {ENV_MAX} bytes, more than a process's environment variable "
                "may hold (Linux's MAX_ARG_STRLEN)",
                where,
            )


RUN_DIR_NAMES = ("work_group", "user_name", "exp_name")  # one folder each under the workspace
NAME_MAX = 255  # bytes in one folder name (ext4, xfs, NFS)


def name_problem(name: Any) -> str | None:
    """Why `name` cannot be one folder of the run directory, or None."""
    if not isinstance(name, str) or not name:
        return "it is empty" if name in ("", None) else None
    if not name.strip():
        return "it is only whitespace"
    if name.startswith(("/", "\\")):
        return "it is an absolute path"
    if "/" in name or "\\" in name:
        return "it holds a path separator"
    if name in (".", ".."):
        return "'.' and '..' name the folder that would hold it and that folder's parent"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it holds a control character"
    if len(name.encode(errors="replace")) > NAME_MAX:
        return f"it is longer than {NAME_MAX} bytes, the most a folder name may have"
    return None


def check_run_dir(exp: ConfigTree) -> None:
    """The run directory, workspace/work_group/user_name/exp_name, lies inside the workspace:
    each of the three names is one folder name, and the workspace is set."""
    workspace = exp.data.get("workspace")
    if not isinstance(workspace, str) or not workspace.strip():  # blanks: a folder named ' '
        raise ConfigError(
            "workspace is empty" if not workspace else f"workspace {workspace!r} is blank",
            exp.origin(("workspace",)),
            hint="set workspace to a folder",
        )
    for key in RUN_DIR_NAMES:
        name = exp.data.get(key)
        problem = name_problem(name)
        if problem:
            shown = "null" if name is None else repr(clipped(name))
            raise ConfigError(
                f"{key} {shown} is not a folder name: {problem}",
                exp.origin((key,)),
                hint=f"{key} is one folder of the run directory "
                "<workspace>/<work_group>/<user_name>/<exp_name>: write a plain name",
            )
