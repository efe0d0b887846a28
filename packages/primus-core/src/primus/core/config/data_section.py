"""A module's `data:` section: the prepared corpus a pretraining run reads (`primus data
prepare`'s PREFIX.bin/.idx), or several blended by weight, the sequence length and the seed of
the sample order. Written the same for every backend that reads prepared corpora (capability
`corpus`); each turns it into its own keys (`BackendAdapter.corpus_params`), which take their
place among the module's params with the section's lines as their origin.

    data:
      path: /data/web/corpus             # or [{path: /data/web/corpus, weight: 0.7}, ...]
      seq_length: 2048                   # default: the backend's own key
      seed: 1234

Paths are relative to the current directory, like every path in an experiment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.core.config.schema import ParamSchema, ParamSpec
from primus.core.config.sections import Located, read_section
from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import KeyPath
from primus.core.errors import ConfigError, Origin

DATA_SCHEMA = ParamSchema(
    {
        "data.path": ParamSpec(
            (str, list),
            "the prepared corpus: PREFIX of PREFIX.bin and PREFIX.idx (primus data prepare), "
            "or a list of {path, weight} to blend (weights: each corpus's share of the samples)",
        ),
        "data.seq_length": ParamSpec(int, "tokens per sample; default: the backend's own key"),
        "data.seed": ParamSpec(int, "seed of the documents' and the samples' order", default=1234),
    }
)
BLEND_HINT = "data.path: PREFIX, or a list of {path: PREFIX, weight: SHARE}"


@dataclass(frozen=True)
class Corpus:
    """One prepared corpus: its PREFIX and, in a blend, its weight (None alone)."""

    prefix: Path
    weight: float | None = None


@dataclass(frozen=True)
class DataConfig(Located):
    """`data:` resolved: absolute prefixes, the seed's default filled."""

    corpora: tuple[Corpus, ...]
    seq_length: int | None
    seed: int
    origins: dict[str, Origin] = field(compare=False, repr=False)

    def corpus_keys(self, path_key: str, blend_key: str) -> dict[str, tuple[Any, str]]:
        """For `corpus_params`: the one corpus's PREFIX at `path_key`, or the blend as
        [{path, weight}, ...] at `blend_key`; their `data:` key is `path`. A single corpus is
        never a blend (a blend of one would order its samples otherwise)."""
        if len(self.corpora) == 1:
            return {path_key: (str(self.corpora[0].prefix), "path")}
        blend = [{"path": str(c.prefix), "weight": c.weight} for c in self.corpora]
        return {blend_key: (blend, "path")}

    @property
    def written(self) -> dict[str, Any]:
        """The section, as resolved."""
        path: Any = [{"path": str(c.prefix), "weight": c.weight} for c in self.corpora]
        if len(self.corpora) == 1 and self.corpora[0].weight is None:
            path = str(self.corpora[0].prefix)
        values = {"path": path, "seq_length": self.seq_length, "seed": self.seed}
        return {k: v for k, v in values.items() if v is not None}


def _prefix(value: Any, origin: Origin | None) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"a corpus path must be a non-empty string, got {value!r}", origin,
                          hint=BLEND_HINT)  # fmt: skip
    if value.endswith((".bin", ".idx")):
        raise ConfigError(
            f"data.path names the corpus by its PREFIX, not a file: {value}",
            origin,
            hint=f"data.path: {value[:-4]}",
        )
    path = Path(value).expanduser().absolute()
    if path.is_dir() and not path.with_name(f"{path.name}.idx").exists():
        held = sorted(p.with_suffix("") for p in path.glob("*.idx"))
        names = f" (its corpora: {', '.join(p.name for p in held)})" if held else ""
        raise ConfigError(
            f"data.path names the corpus by its PREFIX, not a folder: {value}{names}",
            origin,
            hint=f"data.path: {held[0]}" if len(held) == 1 else "data.path: FOLDER/PREFIX",
        )
    return path


def _corpora(value: Any, origin: Origin | None) -> tuple[Corpus, ...]:
    if isinstance(value, str):
        return (Corpus(_prefix(value, origin)),)
    if not value:
        raise ConfigError("data.path is an empty list", origin, hint=BLEND_HINT)
    corpora = []
    for index, item in enumerate(value):
        where = f"data.path[{index}]"
        if not isinstance(item, dict) or set(item) != {"path", "weight"}:
            raise ConfigError(f"{where} must be {{path: PREFIX, weight: SHARE}}, got {item!r}",
                              origin, hint=BLEND_HINT)  # fmt: skip
        weight = item["weight"]
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(f"{where}.weight must be a number, got {weight!r}", origin)
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{where}.weight must be positive, got {weight}", origin)
        corpora.append(Corpus(_prefix(item["path"], origin), float(weight)))
    if len({c.prefix for c in corpora}) < len(corpora):
        raise ConfigError("data.path names a corpus twice", origin,
                          hint="give each corpus once, with its whole weight")  # fmt: skip
    if not math.isfinite(sum(c.weight or 0.0 for c in corpora)):
        raise ConfigError("data.path's weights add up to more than a float holds", origin,
                          hint="give each corpus its share (1 and 3, or 0.25 and 0.75)")  # fmt: skip
    return tuple(corpora)


def data_config(exp: ConfigTree, module: KeyPath) -> DataConfig | None:
    """The module's `data:` section, checked; None where the module has none."""
    section = read_section(exp, module, "data", DATA_SCHEMA)
    if section is None:
        return None
    values, origins = section
    if values.get("path") is None:
        raise ConfigError("data: needs path, the prepared corpus", origins[""], hint=BLEND_HINT)
    seq_length = values.get("seq_length")
    if seq_length is not None and seq_length < 2:
        raise ConfigError(f"data.seq_length must be at least 2, got {seq_length}",
                          origins["seq_length"])  # fmt: skip
    if values["seed"] < 0:
        raise ConfigError(f"data.seed must be at least 0, got {values['seed']}", origins["seed"])
    corpora = _corpora(values["path"], origins.get("path"))
    return DataConfig(corpora, seq_length, values["seed"], origins)
