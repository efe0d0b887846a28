"""Helpers for a backend's tests of `primus train posttrain`: the tiny HF model and reverse
task as a CPU SFT recipe's comment makes them, the recipe run as shipped, an experiment over
the recipe, its run, its eval rows and evals, its export.

Test-only; needs what `primus.testing.sft_data` and `hf_models` need, and the repository
(primus-testing runs from its source tree).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from primus.testing.hf_models import hf_logits
from primus.testing.runs import primus, step_metrics

REPO = Path(__file__).resolve().parents[5]
SHIPPED = "configs/data/sft-tiny"  # the reverse task and tokenizer the CPU recipes use
# The model command of a CPU SFT recipe's comment, run from the repository root.
MODEL_COMMAND = ("checkpoint", "tiny", "--tokenizer", f"{SHIPPED}/tokenizer",
                 "--hf", "output/sft-tiny/hf")  # fmt: skip


def make_task(root: Path) -> dict[str, Path]:
    """The tiny Llama-3 HF model made by the recipes' model command (its `--hf` in `root/hf`),
    and the shipped reverse task (`chat_train`, `chat_eval`: 4096 train and 64 eval samples)."""
    from primus.testing.fuzz_runs import run_in_process

    hf = root / "hf"
    root.mkdir(parents=True, exist_ok=True)
    done = run_in_process([*MODEL_COMMAND[:-1], str(hf)], REPO, {"PRIMUS_WORKSPACE": str(root)})
    assert done.code == 0, done.stderr[-3000:]
    data = REPO / SHIPPED
    return {
        "hf": hf,
        "chat_train": data / "chat_train.jsonl",
        "chat_eval": data / "chat_eval.jsonl",
    }


def shipped_run(recipe: Path, folder: Path, task: dict[str, Path]) -> Path:
    """`recipe` run as its comment says (`primus train posttrain --config configs/...` from the
    repository root, on the shipped data), with `task`'s model (make_task) and its workspace in
    `folder` (PRIMUS_SFT_HF, PRIMUS_WORKSPACE, PRIMUS_EXP_NAME): the run directory, which
    `sft_experiment(recipe, folder, task)` names too."""
    config = recipe.resolve().relative_to(REPO)
    comment = recipe.read_text()
    for command in (MODEL_COMMAND, ("train", "posttrain", "--config", str(config))):
        assert f"#   uv run primus {' '.join(command)}\n" in comment, command
    done = primus("train", "posttrain", "--config", str(config), cwd=REPO,
                  PRIMUS_SFT_HF=str(task["hf"]), PRIMUS_WORKSPACE=str(folder / "ws"),
                  PRIMUS_EXP_NAME=folder.name)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = run_dir(sft_experiment(recipe, folder, task))
    assert (run / "metrics.jsonl").is_file(), run
    return run


def sft_experiment(
    recipe: Path,
    folder: Path,
    task: dict[str, Path],
    peft: dict[str, Any] | None = None,
    adapter: Path | None = None,
    **sft: Any,
) -> Path:
    """`recipe` (one module, `post_trainer`) on `task`'s chat data (sft keys changed by `sft`,
    with `peft`, its adapters starting from the PEFT `adapter`), its workspace in `folder`;
    the experiment file."""
    folder.mkdir(parents=True, exist_ok=True)
    module: dict[str, Any] = {
        "init_from": {"hf": str(task["hf"])} | ({"adapter": str(adapter)} if adapter else {}),
        "sft": {"train": str(task["chat_train"]), "eval": str(task["chat_eval"]), **sft},
    }
    if peft is not None:
        module["peft"] = peft
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({"extends": str(recipe), "exp_name": folder.name,
                                   "workspace": str(folder / "ws"),
                                   "modules": {"post_trainer": module}}))  # fmt: skip
    return exp


def run_dir(exp: Path) -> Path:
    """The run directory of `exp`."""
    from primus.core.runtime import resolution

    return resolution.load(exp, [], None, single=True).run_dir


def posttrain(exp: Path, *overrides: str) -> Path:
    """`primus train posttrain` of `exp`; the run directory."""
    done = primus("train", "posttrain", "--config", str(exp), *overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir(exp)


def module_of(exp: Path) -> Any:
    """The resolved module of a one-module experiment."""
    from primus.core.runtime import resolution

    return next(iter(resolution.load(exp, [], None, single=True).modules.values()))


def eval_rows(exp: Path) -> Any:
    """The eval rows of `exp`'s sft: section, as core builds them."""
    from primus.core.posttrain import build_sft_data

    rows = build_sft_data(module_of(exp).sft).eval
    assert rows is not None
    return rows


def eval_lines(run: Path) -> dict[int, dict[str, Any]]:
    """Step -> metrics.jsonl record, for the steps that evaluated."""
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


def safetensors(folder: Path) -> dict[str, Any]:
    """Every tensor of the safetensors files in `folder`."""
    from safetensors.torch import load_file

    return {k: v for p in sorted(folder.glob("*.safetensors")) for k, v in load_file(p).items()}


def experiment_of(run: Path) -> Path:
    """The experiment file `sft_experiment` wrote for a run directory."""
    return run.parents[3] / "exp.yaml"


def export(exp: Path, out: Path, adapter: Path | None = None) -> Path:
    """`primus checkpoint export` of `exp`'s run (its latest checkpoint) to `out`, and its
    LoRA adapters to `adapter` when given (one command)."""
    also = ["--adapter", str(adapter)] if adapter else []
    done = primus("checkpoint", "export", "--config", str(exp), "--hf", str(out), *also)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def assert_run_keeps_its_adapter(exp: Path, adapter: Path, *overrides: str) -> None:
    """`exp` (its `init_from.adapter` the PEFT `adapter`) trained at learning rate 0 (by
    `overrides`) ends with the adapter it started from: its `checkpoint export --adapter`
    holds the same tensors, bit for bit."""
    from safetensors.torch import load_file

    run = posttrain(exp, *overrides)
    assert f"the adapters start from {adapter}" in (run / "logs" / "rank-0.log").read_text()
    out = exp.parent / "adapter-again"
    done = primus("checkpoint", "export", "--config", str(exp), "--adapter", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    before, after = (load_file(f / "adapter_model.safetensors") for f in (adapter, out))
    assert sorted(after) == sorted(before) and len(before) >= 4
    assert all(after[k].equal(before[k]) for k in before), [k for k in before
                                                             if not after[k].equal(before[k])]  # fmt: skip


def assert_adapter_is_the_merged_export(base: Path, adapter: Path, merged: Path) -> None:
    """The PEFT adapter folder `adapter`, loaded by peft onto the HF model `base` it names,
    gives the logits of the merged export `merged` (fp32)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert Path(config["base_model_name_or_path"]) == base.resolve()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokens = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(model, adapter).eval()(tokens).logits
    assert (adapted - hf_logits(merged, tokens)).abs().max() <= 1e-4


def assert_evaluates_as(hf_dir: Path, exp: Path, metrics: dict[str, Any]) -> None:
    """transformers' eval of the HF model in `hf_dir` over `exp`'s eval rows equals a run's
    eval (a metrics.jsonl record)."""
    import pytest

    from primus.testing.sft_data import hf_eval_stats

    stats = hf_eval_stats(hf_dir, eval_rows(exp))
    assert stats.loss == pytest.approx(metrics["eval_loss"], rel=1e-4)
    assert stats.accuracy == pytest.approx(metrics["eval_token_accuracy"], abs=1e-6)


def assert_learned(run: Path, steps: int) -> None:
    """The run's last eval (at `steps`) reaches 95% token accuracy, below its first eval loss,
    on the step line; steps without eval have none."""
    evals = eval_lines(run)
    last = evals[steps]
    assert last["eval_token_accuracy"] >= 0.95, evals
    assert last["eval_loss"] < evals[min(evals)]["eval_loss"]
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"step {steps}/{steps} | loss" in log and "| eval token acc " in log
    assert all(m["eval_loss"] is None for m in step_metrics(run) if m["step"] not in evals)


def assert_continues(run: Path, resumed_run: Path, step: int) -> None:
    """`resumed_run`, resumed from `run`'s checkpoint at `step`, logs `run`'s losses and evals
    from there on."""
    import pytest

    whole = {m["step"]: m for m in step_metrics(run)}
    resumed = {m["step"]: m for m in step_metrics(resumed_run)}
    assert sorted(resumed) == [s for s in sorted(whole) if s > step]
    keys = ("loss", "eval_loss", "eval_token_accuracy")
    for at, metrics in resumed.items():
        got, expected = ([m[k] for k in keys if m[k] is not None] for m in (metrics, whole[at]))
        assert got == pytest.approx(expected, rel=1e-5) and len(got) == len(expected), at
    assert resumed[max(whole)]["eval_loss"] is not None


def assert_adapters_learned(run: Path, hf_dir: Path, step: int) -> None:
    """The run's eval loss at `step` is well below the base model's (transformers' eval of
    the HF source `hf_dir`: the adapted model before training)."""
    from primus.testing.sft_data import hf_eval_stats

    base = hf_eval_stats(hf_dir, eval_rows(experiment_of(run))).loss
    assert eval_lines(run)[step]["eval_loss"] < base - 0.3, base


def assert_merged_only(source: Path, merged: Path, targets: list[str]) -> None:
    """The merged export holds the HF source's tensors: the bits of the source where no
    adapter was (HF name without any of `targets`), changed where one was."""
    import torch

    theirs, ours = safetensors(source), safetensors(merged)
    assert sorted(theirs) == sorted(ours)
    for key, tensor in theirs.items():
        adapted = any(f".{t}." in key for t in targets)
        assert torch.equal(ours[key], tensor) != adapted, key


def assert_export_evaluates_as_run(run: Path, out: Path, step: int) -> None:
    """`primus checkpoint export` of the run to `out` carries the tokenizer, and transformers'
    eval of it equals the run's eval at `step`."""
    exp = experiment_of(run)
    assert (export(exp, out) / "tokenizer.json").is_file()
    assert_evaluates_as(out, exp, eval_lines(run)[step])


def resumed(run: Path, exp: Path, folders: list[str]) -> Path:
    """The run directory of `exp`, holding only `folders` (paths relative to `run`) of `run`'s
    checkpoints: to resume from."""
    import shutil

    resumed_run = run_dir(exp)
    for folder in folders:
        shutil.copytree(run / folder, resumed_run / folder)
    return resumed_run


def published_dry_run(
    recipe: Path, task: dict[str, Path], folder: Path, *overrides: str
) -> tuple[Path, str]:
    """`primus train posttrain --dry-run --full` of a GPU recipe (with `overrides`) with Llama-3.2-1B's
    published config.json as its HF model (no weights) and `task`'s data: (the HF folder,
    stdout)."""
    from primus.testing.hf_models import make_published_shell

    hf = make_published_shell(folder / "hf", "llama3.2_1B")  # headers, no weights
    done = primus("train", "posttrain", "--config", str(recipe), "--dry-run", "--full", *overrides,
                  PRIMUS_SFT_HF=str(hf), PRIMUS_SFT_DATA=str(task["chat_train"].parent),
                  PRIMUS_WORKSPACE=str(folder / "ws"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return hf, done.stdout
