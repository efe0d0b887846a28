"""The patch inventory and the deep-dive, read from the registry."""

from __future__ import annotations

import inspect
import json
import re
import textwrap

from primus.core.patches.patch import Patch

PHASE_TIMING = {
    "setup": "before the backend is prepared and its config converted (the config is already "
    "validated, which may have read the upstream's own schema)",
    "build_args": "after the backend args are built, before the trainer exists",
    "before_train": "after trainer.setup() and trainer.init(), right before training",
    "after_train": "after training returns, before cleanup",
}
COLUMNS = (
    "id",
    "what it does",
    "target",
    "code location",
    "how to enable",
    "phase",
    "priority",
    "version gate",
)


def how_to_enable(patch: Patch) -> str:
    gate = f"; upstream {patch.gate_text}" if patch.versions else ""
    needs = f"; requires {patch.requires}" if patch.requires else ""
    return f"{patch.condition_text}{gate}{needs}"


def row(patch: Patch) -> dict[str, str]:
    return {
        "id": patch.id,
        "backend": patch.backend,
        "what it does": patch.description,
        "target": patch.target or "N/A (rewrites args / sets env / lifecycle hook)",
        "code location": patch.location,
        "how to enable": how_to_enable(patch),
        "phase": patch.phase,
        "priority": str(patch.priority),
        "version gate": patch.gate_text,
        "tags": ", ".join(patch.tags),
        "requires": patch.requires or "-",
    }


def render(patches: list[Patch], fmt: str) -> str:
    rows = [row(p) for p in patches]
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "markdown":
        out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        out += ["| " + " | ".join(r[c].replace("|", "\\|") for c in COLUMNS) + " |" for r in rows]
        out.append(
            "\nPRIMUS_PATCHES (all / none / a,b / -a) filters on top of each patch's condition."
        )
        return "\n".join(out)
    if not rows:
        return "no patches registered"
    columns = (
        "id",
        "phase",
        "priority",
        "version gate",
        "target",
        "how to enable",
        "code location",
        "what it does",
    )
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in columns[:-1]]
    lines = [
        "  ".join(f"{c:<{w}}" for c, w in zip(columns, widths, strict=False)) + "  what it does"
    ]
    for r in rows:
        cells = "  ".join(f"{r[c]:<{w}}" for c, w in zip(columns, widths, strict=False))
        lines.append(f"{cells}  {r['what it does']}")
    return "\n".join(lines)


def porting_step(target: str | None, source: str, ctx: str = "ctx") -> str:
    """How to carry the change over, from what the handler does: replace code, or set a value."""
    if not target:
        return (
            "No upstream symbol is replaced: the handler rewrites the backend args, sets the "
            "environment, or acts at a lifecycle point."
        )
    rebind = (
        f"rebind or wrap `{target}` in the module that defines it and in every module that "
        f"imported the name before the patch runs (a `from x import y` copy is not updated "
        f"by rebinding `x.y`); `ctx.replace` / `ctx.wrap` do that"
    )
    set_value = (
        f"set `{target}` in your framework's args or config at the same point, as the handler "
        "does (nothing needs rebinding)"
    )
    if re.search(rf"\b{ctx}\.(replace|wrap)\(", source):
        return rebind[0].upper() + rebind[1:] + "."
    if f"{ctx}.set_param(" in source or re.search(rf"get_args\({ctx}\)\.\w+\s*=", source):
        return f"`{target}` is a value, not code: " + set_value + "."
    return f"Where `{target}` is code, {rebind}. Where it is a value, {set_value}."


def deep_dive(patch: Patch) -> str:
    """What it does, patch logic, code location, and a porting plan, all from the metadata."""
    r = row(patch)
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(patch.handler)))
    except (OSError, TypeError):
        source = "(source not available)"
    ctx = next(iter(inspect.signature(patch.handler).parameters), "ctx")
    rebind = porting_step(patch.target, source, ctx)
    return f"""# {patch.id}  ({patch.backend})

## What it does
{patch.description}

## Patch logic
- target: {r["target"]}
- phase: {patch.phase} ({PHASE_TIMING[patch.phase]}), priority {patch.priority}
- condition: {patch.condition_text}
- upstream versions: {r["version gate"]}
- requires: {patch.requires or "-"} (runs only if that patch applied)
- tags: {r["tags"] or "-"}

## Code location
{patch.location}

```python
{source.rstrip()}
```

## Porting into your own framework
1. Copy the handler above from `{patch.location}`, with what it imports from `{patch.module}`.
2. {rebind}
3. Apply it at the same point: {PHASE_TIMING[patch.phase]}, so it lands before the patched
   code is first used.
4. Keep its constraints: condition `{patch.condition_text}`; upstream versions
   `{r["version gate"]}`.
5. Or reuse the engine instead of hand-porting: `pip install primus-core`, register the handler
   with `@register_patch("{patch.id}", backend="{patch.backend}", phase="{patch.phase}", ...)`
   and drive your trainer with `PrimusRuntime`; `PRIMUS_PATCHES=-{patch.id}` turns it off.
"""
