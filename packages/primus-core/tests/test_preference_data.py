"""Preference training's data and loss, backend-free: TRL's record forms into pairs of
samples (tokens and answer masks against the tokenizer's own rendering), the pairs' order,
the `dpo:` keys and every refusal at its line, and the loss against a float64 formula."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from primus.core.config.experiment import load_experiment
from primus.core.errors import ConfigError
from primus.core.posttrain import build_pair_data, build_sft_data, dpo_loss_torch
from primus.core.posttrain.encode import load_tokenizer
from primus.testing.dpo import write_preference_task
from primus.testing.sft_data import EOT, write_tokenizer

PROMPT = [
    {"role": "user", "content": "apple river"},
    {"role": "assistant", "content": "river apple"},
    {"role": "user", "content": "green lamp stone"},
]
CHOSEN = [{"role": "assistant", "content": "stone lamp green"}]
REJECTED = [{"role": "assistant", "content": "green lamp stone"}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("pref") / "tok")


def experiment(tmp_path: Path, tok_dir: Path, records: list[Any], **sections: Any) -> Path:
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    module = {
        "framework": "none",
        "sft": {"train": str(data), "tokenizer": str(tok_dir), "seq_length": 48},
        "dpo": {"beta": 0.5},
    }
    for name, section in sections.items():
        module[name] = section if section is None else {**module.get(name, {}), **section}
    module = {k: v for k, v in module.items() if v is not None}
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({"modules": {"posttrain": module}}))
    return path


def module(path: Path) -> Any:
    return load_experiment(path).modules["posttrain"]


def pairs(tmp_path: Path, tok_dir: Path, records: list[Any], **sections: Any) -> Any:
    sft = module(experiment(tmp_path, tok_dir, records, **sections)).sft
    return build_pair_data(sft, load_tokenizer(sft))


def answer_tokens(row: dict[str, Any], side: int) -> list[int]:
    labels, mask = row["labels"][side], row["loss_mask"][side]
    return [int(t) for t, m in zip(labels, mask, strict=True) if m]


def test_a_chat_pair_trains_on_its_answer_only(tmp_path: Path, tok_dir: Path) -> None:
    """Each side is the tokenizer's rendering of prompt + answer; the mask covers the answer's
    content and end of turn, not the prompt's earlier assistant turn."""
    record = {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}
    data = pairs(tmp_path, tok_dir, [record])
    tokenizer, row = data.tokenizer, data.train[0]
    for side, answer in ((0, CHOSEN), (1, REJECTED)):
        ids = tokenizer.apply_chat_template([*PROMPT, *answer])["input_ids"]
        n = len(ids) - 1
        assert row["tokens"][side][:n].tolist() == ids[:-1]
        assert row["labels"][side][:n].tolist() == ids[1:]
        wanted = tokenizer(f"{answer[0]['content']} {EOT}", add_special_tokens=False)
        assert answer_tokens(row, side) == wanted["input_ids"]


def test_string_pairs_and_an_implicit_prompt(tmp_path: Path, tok_dir: Path) -> None:
    strings = {"prompt": "reverse : apple river =", "chosen": "river apple", "rejected": "apple"}
    row = pairs(tmp_path, tok_dir, [strings]).train[0]
    tokenizer = load_tokenizer(module(experiment(tmp_path, tok_dir, [strings])).sft)
    prompt = tokenizer(strings["prompt"])["input_ids"]
    for side, answer in ((0, "river apple"), (1, "apple")):
        completion = [
            *tokenizer(answer, add_special_tokens=False)["input_ids"],
            tokenizer.eos_token_id,
        ]
        n = len(prompt) + len(completion) - 1
        assert row["labels"][side][:n].tolist() == [*prompt, *completion][1:]
        assert answer_tokens(row, side) == completion
    implicit = {"chosen": [*PROMPT, *CHOSEN], "rejected": [*PROMPT, *REJECTED]}
    explicit = {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}
    a, b = (pairs(tmp_path, tok_dir, [r]).train[0] for r in (implicit, explicit))
    assert all((a[k] == b[k]).all() for k in a)


def test_the_pairs_order_keeps_each_pair_whole(tmp_path: Path, tok_dir: Path) -> None:
    files = write_preference_task(tmp_path / "task", n_train=12)
    path = experiment(
        tmp_path, tok_dir, [json.loads(x) for x in files["train"].read_text().splitlines()]
    )
    data = build_pair_data(module(path).sft)
    batch = data.train.batch(10, 4)  # over the first epoch's end: the next epoch's shuffle
    assert batch["tokens"].shape == (4, 2, 48)
    for i in range(4):
        chosen, rejected = (answer_tokens({k: v[i] for k, v in batch.items()}, s) for s in (0, 1))
        assert chosen[:-1][::-1] == rejected[:-1] and chosen != rejected  # the same words
    assert [data.train.row(p)["tokens"].tolist() for p in (12, 13)] == [
        batch["tokens"][k].tolist() for k in (2, 3)
    ]
    assert "12 preference pairs" in data.train.describe()


def test_the_eval_pairs_are_held_out_or_read_from_their_file(tmp_path: Path, tok_dir: Path) -> None:
    """`sft.eval_fraction` holds out whole pairs; `sft.eval` reads a preference file."""
    files = write_preference_task(tmp_path / "task", n_train=20, n_eval=3)
    train, held = ([json.loads(x) for x in files[k].read_text().splitlines()]
                   for k in ("train", "eval"))  # fmt: skip
    data = pairs(tmp_path, tok_dir, train, sft={"eval_fraction": 0.1})
    assert data.eval is not None and (len(data.train), len(data.eval)) == (18, 2)
    data = pairs(tmp_path, tok_dir, train, sft={"eval": str(files["eval"])})
    assert data.eval is not None and (len(data.train), len(data.eval)) == (20, len(held))
    assert "3 preference pairs" in data.eval.describe()
    assert (data.eval[0]["loss_mask"].sum(-1) > 0).all()  # both sides have answer tokens


@pytest.mark.parametrize(
    ("sections", "key", "message"),
    [
        ({"dpo": {"beta": 0}}, "beta", "dpo.beta must be positive"),
        ({"dpo": {"label_smoothing": 0.5}}, "label_smoothing", "below 0.5"),
        ({"sft": {"packing": True}}, "packing", "sft.packing True does not go with dpo:"),
        ({"sft": {"train_on_prompt": True}}, "train_on_prompt", "does not go with dpo:"),
        ({"sft": {"format": "chat"}}, "format", "sft.format chat does not go with dpo:"),
        ({"sft": None}, "dpo", "dpo: trains on the sft: section's data"),
    ],
)
def test_dpo_keys_that_cannot_work_are_refused_at_their_line(
    tmp_path: Path, tok_dir: Path, sections: dict[str, Any], key: str, message: str
) -> None:
    path = experiment(
        tmp_path, tok_dir, [{"chosen": "a", "rejected": "b", "prompt": "c"}], **sections
    )
    with pytest.raises(ConfigError, match=message) as raised:
        module(path)
    assert raised.value.origin is not None and raised.value.origin.file == str(path)
    assert raised.value.origin.line == 1  # the experiment is one line of JSON


def test_records_of_the_wrong_kind_are_refused_at_file_and_line(
    tmp_path: Path, tok_dir: Path
) -> None:
    chat = {"messages": [*PROMPT[:2]]}
    good = {"prompt": "apple", "chosen": "river", "rejected": "stone"}
    sft = module(experiment(tmp_path, tok_dir, [good, chat])).sft
    with pytest.raises(ConfigError, match="2: a chat record, but the dpo: section trains on"):
        build_pair_data(sft)
    sft = module(experiment(tmp_path, tok_dir, [good], dpo=None)).sft  # no dpo: fine-tuning
    with pytest.raises(
        ConfigError, match=r"1: a preference record .* preference training"
    ) as raised:
        build_sft_data(sft)
    assert "add dpo:" in (raised.value.hint or "")
    for bad, why in (
        ({"chosen": "river", "rejected": "stone"}, "'prompt' is missing"),
        ({"prompt": "a", "chosen": "river", "rejected": CHOSEN}, "both be strings or both"),
        ({"prompt": PROMPT, "chosen": "b", "rejected": "c"}, "a list of messages but 'chosen'"),
        (
            {"prompt": "a", "chosen": [{"role": "robot", "content": "x"}], "rejected": CHOSEN},
            r"chosen\[0\] has unknown role",
        ),
        ({"prompt": [], "chosen": CHOSEN, "rejected": REJECTED}, "'prompt' must be a non-empty"),
        ({"chosen": [*PROMPT, *CHOSEN], "rejected": [*PROMPT, *CHOSEN]}, "are the same"),
        ({"prompt": "a", "chosen": "b", "rejected": "b"}, "'chosen' and 'rejected' are the same"),
        (
            {"prompt": "a", "chosen": PROMPT[:1], "rejected": CHOSEN},
            "chosen after the prompt has no",
        ),
        (
            {"question": "a", "good": "b", "bad": "c"},
            r"needs 'chosen' and 'rejected' \(preference\); it has 'question', 'good', 'bad'",
        ),
    ):
        sft = module(experiment(tmp_path, tok_dir, [bad])).sft
        with pytest.raises(ConfigError, match=why):
            build_pair_data(sft)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_is_the_dpo_formula(smoothing: float) -> None:
    import torch

    from primus.core.config.posttrain import DPOConfig

    policy = torch.tensor([[-3.0, -5.0], [-7.5, -2.0], [-1.0, -1.0]], requires_grad=True)
    reference = torch.tensor([[-4.0, -4.0], [-6.0, -3.0], [-1.5, -0.5]])
    loss, metrics = dpo_loss_torch(policy, reference, DPOConfig(0.5, smoothing, False, {}))
    expected, margins = 0.0, []
    for (pc, pr), (rc, rr) in zip(policy.tolist(), reference.tolist(), strict=True):
        margin = 0.5 * ((pc - rc) - (pr - rr))
        margins.append(margin)
        sig = 1 / (1 + math.exp(-margin))
        expected += (-(1 - smoothing) * math.log(sig) - smoothing * math.log(1 - sig)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["reward_margin"].item() == pytest.approx(sum(margins) / 3, rel=1e-6)
    assert metrics["reward_accuracy"].item() == pytest.approx(sum(m > 0 for m in margins) / 3)
    loss.backward()
    assert policy.grad is not None and policy.grad[:, 0].lt(0).all()  # raise the chosen


def test_the_eval_metrics_are_means_over_the_pairs_less_the_padding() -> None:
    """The eval sums of two batches, a padding pair in the second, divide into the training
    metrics of the real pairs taken as one batch."""
    import torch

    from primus.core.config.posttrain import DPOConfig
    from primus.core.posttrain import EVAL_METRICS, dpo_eval_metrics, dpo_eval_sums_torch

    dpo = DPOConfig(0.5, 0.1, False, {})
    policy = torch.tensor([[-3.0, -5.0], [-7.5, -2.0], [-1.0, -1.0], [0.0, 0.0]])
    reference = torch.tensor([[-4.0, -4.0], [-6.0, -3.0], [-1.5, -0.5], [0.0, 0.0]])
    valid = torch.tensor([True, True, True, False])
    sums = sum(dpo_eval_sums_torch(policy[i:j], reference[i:j], valid[i:j], dpo)
               for i, j in ((0, 2), (2, 4)))  # fmt: skip
    assert isinstance(sums, torch.Tensor) and sums.dtype == torch.float64
    metrics = dpo_eval_metrics(sums.tolist())
    loss, train = dpo_loss_torch(policy[:3], reference[:3], dpo)
    expected = [loss.item(), *(train[k].item() for k in train)]
    assert list(metrics) == list(EVAL_METRICS) == ["eval_loss", *(f"eval_{k}" for k in train)]
    assert list(metrics.values()) == pytest.approx(expected, rel=1e-6)
    assert math.isnan(dpo_eval_metrics([0.0] * 6)["eval_loss"])
