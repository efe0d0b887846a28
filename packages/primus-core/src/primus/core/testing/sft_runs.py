"""Helpers for a backend's fine-tuning tests: the tiny HF model and reverse task, an experiment
over a backend's CPU SFT recipe, and what a finished `primus train posttrain` left.

Test-only; needs what `primus.core.testing.sft_data` and `hf_models` need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from primus.core.testing.runs import primus, step_metrics


def reverse_task(root: Path) -> dict[str, Path]:
    """The tiny Llama-3 HF model (`hf`, with the tiny tokenizer in its folder) and the reverse
    task's files (4096 train, 64 eval samples) under `root`."""
    from primus.core.testing.hf_models import make_hf_model
    from primus.core.testing.sft_data import write_reverse_task, write_tokenizer

    hf = make_hf_model(root / "hf", "llama3")
    write_tokenizer(hf)
    return {"hf": hf, "root": root, **write_reverse_task(root / "data", 4096, 64)}


def sft_experiment(
    recipe: Path,
    folder: Path,
    task: dict[str, Path],
    peft: dict[str, Any] | None = None,
    **sft: Any,
) -> Path:
    """`recipe` (a CPU SFT recipe, module `post_trainer`) on `task` from its HF model, with sft
    keys changed by `sft` and with `peft`, in `folder`: the experiment file."""
    folder.mkdir(parents=True, exist_ok=True)
    module: dict[str, Any] = {
        "init_from": {"hf": str(task["hf"])},
        "sft": {"train": str(task["chat_train"]), "eval": str(task["chat_eval"]), **sft},
    }
    if peft is not None:
        module["peft"] = peft
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({"extends": str(recipe), "exp_name": folder.name,
                                   "workspace": str(folder / "ws"),
                                   "modules": {"post_trainer": module}}))  # fmt: skip
    return exp


def module_of(exp: Path) -> Any:
    """The resolved module of a one-module experiment."""
    from primus.core.runtime import resolution

    return next(iter(resolution.load(exp, [], None, single=True).modules.values()))


def run_dir(exp: Path) -> Path:
    from primus.core.runtime import resolution

    return resolution.load(exp, [], None, single=True).run_dir


def posttrain(exp: Path, *overrides: str) -> Path:
    """`primus train posttrain` of `exp` (which must succeed); the run directory."""
    done = primus("train", "posttrain", "--config", str(exp), *overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir(exp)


def eval_rows(exp: Path) -> Any:
    """The eval rows of `exp`'s sft: section, as core builds them."""
    from primus.core.posttrain import build_sft_data

    rows = build_sft_data(module_of(exp).sft).eval
    assert rows is not None
    return rows


def eval_lines(run: Path) -> dict[int, dict[str, Any]]:
    """The metrics.jsonl lines of a run that carry an eval, by step."""
    return {m["step"]: m for m in step_metrics(run) if m["eval_loss"] is not None}


def template_tokens(task: dict[str, Path], rows: Any, position: int) -> tuple[list[int], list[int]]:
    """For the training row at `position` (one sample, packing off): the tokens of its chat as
    the tokenizer's own chat template renders it, and the targets the loss must cover (the
    assistant's answer, then <|eot_id|>)."""
    import json

    from transformers import AutoTokenizer

    records = [json.loads(line) for line in task["chat_train"].read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(task["hf"])
    (sample,) = rows.rows[rows.order(position // len(rows))[position % len(rows)]]
    messages = records[sample]["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
    return full, [*answer, tokenizer.convert_tokens_to_ids("<|eot_id|>")]


def experiment_of(run: Path) -> Path:
    """The experiment file `sft_experiment` wrote for a run directory."""
    return run.parents[3] / "exp.yaml"


def assert_export_evaluates_as_the_run(run: Path, out: Path, step: int) -> None:
    """`primus checkpoint export` of `run` into `out` gives an HF model (with the tokenizer)
    whose transformers eval equals the run's eval at `step`."""
    import pytest

    from primus.core.testing.sft_data import hf_eval_stats

    exp = experiment_of(run)
    done = primus("checkpoint", "export", "--config", str(exp), "--hf", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "tokenizer.json").is_file()
    stats = hf_eval_stats(out, eval_rows(exp))
    logged = eval_lines(run)[step]
    assert stats.loss == pytest.approx(logged["eval_loss"], rel=1e-4)
    assert stats.accuracy == pytest.approx(logged["eval_token_accuracy"], abs=1e-6)


def assert_continues(run: Path, resumed_run: Path, after: int) -> None:
    """`resumed_run` logged `run`'s losses and evals for every step after `after`, and
    evaluated on the last step."""
    import pytest

    whole = {m["step"]: m for m in step_metrics(run)}
    resumed = {m["step"]: m for m in step_metrics(resumed_run)}
    assert sorted(resumed) == [s for s in sorted(whole) if s > after]
    keys = ("loss", "eval_loss", "eval_token_accuracy")
    for at, metrics in resumed.items():
        got, expected = ([m[k] for k in keys if m[k] is not None] for m in (metrics, whole[at]))
        assert got == pytest.approx(expected, rel=1e-5) and len(got) == len(expected), at
    assert resumed[max(whole)]["eval_loss"] is not None


def dry_run_1b_recipe(recipe: Path, task: dict[str, Path], folder: Path) -> tuple[str, Path]:
    """`primus train posttrain --dry-run` of a backend's Llama-3.2-1B SFT `recipe` with
    Llama-3.2-1B's published config.json (no weights) in `folder`/hf and `task`'s data, which
    must succeed: (its stdout, the HF folder)."""
    from primus.core.testing.hf_models import hf_config

    hf = folder / "hf"
    hf_config("llama3.2_1B").save_pretrained(hf)
    (hf / "model.safetensors").touch()  # init_from wants one; a dry run reads none
    done = primus("train", "posttrain", "--config", str(recipe), "--dry-run",
                  PRIMUS_SFT_HF=str(hf), PRIMUS_SFT_DATA=str(task["root"] / "data"),
                  PRIMUS_WORKSPACE=str(folder / "ws"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, hf
