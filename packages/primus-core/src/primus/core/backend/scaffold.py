"""`primus backends new NAME`: write a backend distribution that works out of the box."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from primus.core.errors import ConfigError
from primus.core.reliability.atomic import write_atomic

TEMPLATE = Path(__file__).parents[2] / "cli" / "templates" / "backend"
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


def scaffold_backend(name: str, folder: Path) -> list[Path]:
    """Write the `primus-backend-<name>` project into `folder` (which must not exist yet);
    return the files written. NAME and CLASS in the templates become the name and its
    CamelCase class prefix."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"'{name}' is not a backend name",
            hint="lower case letters, digits and underscores, starting with a letter",
        )
    if keyword.iskeyword(name):
        raise ConfigError(f"'{name}' is a Python keyword: no module can be named so",
                          hint="choose another name")  # fmt: skip
    from primus.core.backend.backend_registry import BackendRegistry

    installed = BackendRegistry.backends().get(name)
    if installed is not None:
        raise ConfigError(
            f"'{name}' is the name of an installed backend ({installed.distribution or 'this process'})",
            hint="choose another name: two backends of one name would shadow each other",
        )
    if folder.exists():
        raise ConfigError(f"{folder} already exists", hint="choose another folder with --dir")
    class_prefix = "".join(part.capitalize() for part in name.split("_"))
    written = []
    for template in sorted(TEMPLATE.rglob("*.tmpl")):
        relative = str(template.relative_to(TEMPLATE)).removesuffix(".tmpl")
        target = folder / relative.replace("NAME", name)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = template.read_text().replace("CLASS", class_prefix).replace("NAME", name)
        write_atomic(target, text)
        written.append(target)
    return written
