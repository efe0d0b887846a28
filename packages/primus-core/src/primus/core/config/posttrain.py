"""A module's posttrain keys, beside `init_from`: `sft:` (data, tokenizer, sequence), `peft:`
(LoRA) and `dpo:` (preference training on the `sft:` data). Checked when the experiment loads; each error names the file:line it is about.
The data keys' own checks (`train` lists, weights, `columns`) are in `sft_data`.

Paths are relative to the current directory, like every path in an experiment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from primus.core.config.schema import ParamSchema, ParamSpec
from primus.core.config.sections import Located, read_section
from primus.core.config.sft_data import (
    DataFile,
    check_columns,
    data_file,
    existing_path,
    refuse_unknown,
    train_files,
)
from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import KeyPath, read_text
from primus.core.errors import ConfigError, Origin

POSTTRAIN_KEYS = ("sft", "peft", "dpo")
FORMATS = ("auto", "chat", "prompt_completion", "sharegpt", "alpaca", "preference")
# LoRA targets by their Hugging Face (Llama-family) names; each backend maps them to its layers.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SFT_SCHEMA = ParamSchema(
    {
        "sft.train": ParamSpec(
            (str, list),
            "training data: a .jsonl or .parquet file, or a list of files or of "
            "{path, weight, columns} (weights: each file's share of the training samples)",
        ),
        "sft.eval": ParamSpec(str, "eval data (.jsonl or .parquet); default: none"),
        "sft.eval_fraction": ParamSpec(
            float,
            "share of the training samples held out for eval when no eval file (0-0.5); "
            "set in a later layer than sft.eval (a file extending it), it replaces it",
            default=0.0,
        ),
        "sft.format": ParamSpec(
            str,
            "the records' format (auto: each file's first record's)",
            choices=FORMATS,
            default="auto",
        ),
        "sft.columns": ParamSpec(
            dict, "the data's own key for each record key a format reads, e.g. {prompt: question}"
        ),
        "sft.tokenizer": ParamSpec(str, "HF tokenizer directory; default: init_from.hf"),
        "sft.chat_template": ParamSpec(str, "a Jinja chat template, or a file holding one"),
        "sft.seq_length": ParamSpec(int, "tokens per row (the model's input length)"),
        "sft.packing": ParamSpec(bool, "pack several samples into each row", default=False),
        "sft.truncate": ParamSpec(bool, "cut samples longer than a row", default=False),
        "sft.train_on_prompt": ParamSpec(
            bool, "the loss also covers the prompt (user, system) tokens", default=False
        ),
        "sft.seed": ParamSpec(
            int, "seed of the eval split, the weighted mix and the row order", default=1234
        ),
    }
)
PEFT_SCHEMA = ParamSchema(
    {
        "peft.type": ParamSpec(str, "the adapter kind", default="lora", choices=("lora",)),
        "peft.rank": ParamSpec(int, "LoRA rank", default=8),
        "peft.alpha": ParamSpec(
            float, "LoRA alpha: the update is scaled by alpha/rank", default=16.0
        ),
        "peft.dropout": ParamSpec(float, "dropout on the adapter's input", default=0.0),
        "peft.target_modules": ParamSpec(list, "layers that get adapters", default=LORA_TARGETS),
    }
)
DPO_SCHEMA = ParamSchema(
    {
        "dpo.beta": ParamSpec(
            float,
            "the scale of the log-probability ratios to the reference model in the loss: "
            "larger keeps the policy closer to the reference",
            default=0.1,
        ),
        "dpo.label_smoothing": ParamSpec(
            float, "the share of pairs assumed mislabelled (conservative DPO), 0-0.5", default=0.0
        ),
        "dpo.precompute_reference": ParamSpec(
            bool,
            "compute the reference's log-probabilities of every pair once, before the first "
            "step, instead of a reference forward in every step",
            default=False,
        ),
    }
)


@dataclass(frozen=True)
class SFTConfig(Located):
    """`sft:` resolved: absolute paths, defaults filled, the chat template's text read."""

    train: tuple[DataFile, ...]  # one, or several (all with a weight, or none)
    eval: Path | None
    eval_fraction: float
    format: str
    columns: dict[str, str]  # record key -> the data's own key (sft.columns)
    tokenizer: Path
    chat_template: str | None  # the template's text; None: the tokenizer's own
    seq_length: int
    packing: bool
    truncate: bool
    train_on_prompt: bool
    seed: int
    written: dict[str, Any] = field(compare=False, repr=False)  # the section, as resolved
    origins: dict[str, Origin] = field(compare=False, repr=False)


@dataclass(frozen=True)
class PeftConfig(Located):
    """`peft:` resolved. The adapter's update is (alpha / rank) * B @ A."""

    type: str
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    origins: dict[str, Origin] = field(compare=False, repr=False)
    adapter: Path | None = None  # init_from.adapter: the PEFT adapter the adapters start from

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @property
    def written(self) -> dict[str, Any]:
        """The section, as resolved."""
        values = {f: getattr(self, f) for f in ("type", "rank", "alpha", "dropout")}
        return values | {"target_modules": list(self.target_modules)}


@dataclass(frozen=True)
class DPOConfig(Located):
    """`dpo:` resolved: direct preference optimization on the `sft:` section's preference
    records, against the run's initial weights as the frozen reference (the base without
    its adapters, with `peft:`)."""

    beta: float
    label_smoothing: float
    precompute_reference: bool
    origins: dict[str, Origin] = field(compare=False, repr=False)

    @property
    def written(self) -> dict[str, Any]:
        """The section, as resolved."""
        return {
            "beta": self.beta,
            "label_smoothing": self.label_smoothing,
            "precompute_reference": self.precompute_reference,
        }


def _tokenizer_dir(
    values: dict[str, Any], origins: dict[str, Origin], init_from: Path | None
) -> tuple[Path, Origin | None]:
    if values["tokenizer"] is None and init_from is None:
        raise ConfigError("sft needs a tokenizer: set sft.tokenizer or init_from.hf", origins[""])
    if values["tokenizer"] is None:
        assert init_from is not None
        return init_from, origins.get("")
    origin = origins.get("tokenizer")
    folder = existing_path(
        values["tokenizer"], "sft.tokenizer", origin, "an HF tokenizer directory"
    )
    if not any(os.path.isfile(folder / f) for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ConfigError(
            f"sft.tokenizer: {folder} is not a Hugging Face tokenizer directory",
            origin,
            hint="it needs tokenizer.json or tokenizer_config.json",
        )
    return folder, origin


def _chat_template(value: str | None, origin: Origin | None) -> str | None:
    """A template's text: the value itself if it is Jinja, else the file it names."""
    if value is None or "{{" in value or "{%" in value:
        return value
    hint = (
        "a Jinja template (text holding {{ or {%), or a file holding one; leave it out for "
        "the tokenizer's"
    )
    if not value.strip():
        raise ConfigError("sft.chat_template is empty", origin, hint)
    path = existing_path(
        value, "sft.chat_template", origin, "a Jinja template, or a file holding one"
    )
    if path.is_dir():
        raise ConfigError(f"sft.chat_template: {path} is a folder", origin, hint)
    try:
        return read_text(path, "chat template")
    except ConfigError as exc:
        exc.origin = exc.origin or origin
        raise


def _eval_or_fraction(exp: ConfigTree, values: dict[str, Any], origins: dict[str, Origin]) -> None:
    """`eval` and a nonzero `eval_fraction` exclude each other. Set in two layers (a file and
    one that extends it, or the command line), the later one wins and the other is dropped
    (back to its default); set in the same file, an error."""
    if not values["eval_fraction"] or values["eval"] is None:
        return
    eval_layer, fraction_layer = (exp.layer(origins.get(k)) for k in ("eval", "eval_fraction"))
    if eval_layer == fraction_layer:
        raise ConfigError(
            "sft.eval_fraction holds out training samples, but sft.eval names an eval file",
            origins["eval_fraction"],
            hint="set one of them",
        )
    dropped = "eval" if fraction_layer > eval_layer else "eval_fraction"
    values[dropped] = SFT_SCHEMA.specs[f"sft.{dropped}"].default
    del origins[dropped]


def sft_config(exp: ConfigTree, module: KeyPath, init_from: Path | None) -> SFTConfig | None:
    """The module's `sft:` section, checked; None when the module has none."""
    section = read_section(exp, module, "sft", SFT_SCHEMA)
    if section is None:
        return None
    values, origins = section
    for key in ("train", "seq_length"):
        if values[key] is None:
            raise ConfigError(f"sft.{key} is required", origins[""])
    if values["seq_length"] <= 0:
        raise ConfigError("sft.seq_length must be positive", origins["seq_length"])
    if not 0.0 <= values["eval_fraction"] <= 0.5:
        raise ConfigError("sft.eval_fraction must be between 0 and 0.5", origins["eval_fraction"])
    _eval_or_fraction(exp, values, origins)
    columns: dict[str, str] = {}
    if values["columns"] is not None:
        where = {k.split(".", 1)[1]: o for k, o in origins.items() if k.startswith("columns.")}
        columns = check_columns(
            values["columns"], "sft.columns", where | {"": origins.get("columns") or origins[""]}
        )
    train, train_written = train_files(values["train"], origins.get("train"), columns)
    eval_file = None
    if values["eval"] is not None:
        eval_file = data_file(values["eval"], "sft.eval", origins.get("eval"))
        if any(eval_file.resolve() == file.path.resolve() for file in train):
            raise ConfigError(
                f"sft.eval {eval_file} is also a training file (sft.train): its eval loss "
                "would be measured on samples the model trains on",
                origins.get("eval"),
                hint="name a held-out file, or hold training samples out with "
                "sft.eval_fraction instead of sft.eval",
            )
    tokenizer, tokenizer_origin = _tokenizer_dir(values, origins, init_from)
    template = _chat_template(values["chat_template"], origins.get("chat_template"))
    if tokenizer_origin is not None:
        origins.setdefault("tokenizer", tokenizer_origin)
    written = values | {"train": train_written, "tokenizer": str(tokenizer)}
    written |= {"eval": str(eval_file)} if eval_file else {}
    return SFTConfig(
        train, eval_file, float(values["eval_fraction"]), values["format"], columns, tokenizer,
        template, values["seq_length"], values["packing"], values["truncate"],
        values["train_on_prompt"], values["seed"],
        {k: v for k, v in written.items() if v is not None}, origins,
    )  # fmt: skip


def peft_config(exp: ConfigTree, module: KeyPath) -> PeftConfig | None:
    """The module's `peft:` section, checked; None when the module has none."""
    section = read_section(exp, module, "peft", PEFT_SCHEMA)
    if section is None:
        return None
    values, origins = section
    checks = (
        ("rank", values["rank"] > 0, "a positive integer"),
        ("alpha", values["alpha"] > 0, "positive"),
        ("dropout", 0 <= values["dropout"] < 1, "at least 0 and below 1"),
    )
    for key, ok, wanted in checks:
        if not ok:
            raise ConfigError(f"peft.{key} must be {wanted}, got {values[key]}", origins[key])
    targets = values["target_modules"]
    where = origins.get("target_modules")
    if not targets:
        raise ConfigError("peft.target_modules is empty", where, hint=", ".join(LORA_TARGETS))
    hint = f"layers by their Hugging Face names: {', '.join(LORA_TARGETS)}"
    refuse_unknown(targets, LORA_TARGETS, "peft.target_modules: unknown layer", where, hint)
    if len(set(targets)) < len(targets):
        raise ConfigError("peft.target_modules names a layer twice", where)
    return PeftConfig(
        "lora", values["rank"], float(values["alpha"]), float(values["dropout"]),
        tuple(targets), origins,
    )  # fmt: skip


def dpo_config(
    exp: ConfigTree, module: KeyPath, sft: SFTConfig | None
) -> tuple[DPOConfig | None, SFTConfig | None]:
    """The module's `dpo:` section, checked, and its `sft:` section reading preference
    records; (None, sft) when the module has no `dpo:`."""
    section = read_section(exp, module, "dpo", DPO_SCHEMA)
    if section is None:
        return None, sft
    values, origins = section
    if values["beta"] <= 0:
        raise ConfigError(f"dpo.beta must be positive, got {values['beta']}", origins["beta"])
    if not 0 <= values["label_smoothing"] < 0.5:
        raise ConfigError(
            f"dpo.label_smoothing must be at least 0 and below 0.5, got "
            f"{values['label_smoothing']}",
            origins["label_smoothing"],
        )
    if sft is None:
        raise ConfigError(
            "dpo: trains on the sft: section's data, and the module has none",
            origins[""],
            hint="add sft: {train: PREFERENCES.jsonl, seq_length: N} (records with prompt, "
            "chosen and rejected)",
        )
    refused = (
        ("packing", sft.packing, "each row holds one side of one pair: set sft.packing: false"),
        ("train_on_prompt", sft.train_on_prompt, "the loss compares the answers only"),
        ("format", sft.format not in ("auto", "preference"), "set sft.format: preference"),
    )
    for key, on, hint in refused:
        if on:
            raise sft.error(key, f"sft.{key} {sft.written[key]} does not go with dpo:", hint)
    dpo = DPOConfig(
        float(values["beta"]),
        float(values["label_smoothing"]),
        bool(values["precompute_reference"]),
        origins,
    )
    return dpo, replace(sft, format="preference")
