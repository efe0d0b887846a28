"""Fine-tuning data in the formats people have: ShareGPT and Alpaca records, `sft.columns`,
several training files mixed by weight, and `sft.train_on_prompt`; each bad record at its
file and line. The helpers and fixtures are test_posttrain_data.py's."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from primus.core.errors import ConfigError
from primus.core.posttrain import build_sft_data
from primus.core.posttrain.dataset import read_data
from primus.core.posttrain.mixing import shares
from primus.core.posttrain.records import read_records

from .test_posttrain_data import CHAT, chat, config, jsonl, only_row, root, tokenizer

__all__ = ["root", "tokenizer"]  # the fixtures, shared

SHAREGPT = {
    "conversations": [{"from": "human", "value": "apple"}, {"from": "gpt", "value": "apple"}]
}
ALPACA = {"instruction": "apple", "output": "apple"}


@pytest.mark.parametrize(
    ("good", "bad", "message", "values"),
    [
        (SHAREGPT, {"conversations": [{"from": "robot", "value": "x"}]},
         "conversations[0] has unknown 'from' 'robot'\n  hint: 'from' is one of human, user, gpt, "
         "assistant, system, function_call, observation, tool", {}),
        (SHAREGPT, {"conversations": [{"from": ["gpt"], "value": "x"}]}, "conversations[0] has unknown 'from' ['gpt']", {}),
        (SHAREGPT, {"conversations": [{"from": "human"}]}, "conversations[0] 'value' must be a string, got none", {}),
        (SHAREGPT, {"conversations": []}, "'conversations' must be a non-empty array, got an empty one", {}),
        (SHAREGPT, {"conversations": [{"from": "human", "value": "x"}]},
         "conversations has no assistant message: nothing to train on", {}),
        ({"messages": CHAT}, {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]},
         "messages has no assistant message: nothing to train on\n  hint: add the assistant's "
         "answer, or leave the record out", {}),
        (ALPACA, {"instruction": "apple", "output": ""}, "'output' must be a non-empty string, got ''", {}),
        (ALPACA, {"instruction": "a", "input": 3, "output": "b"}, "'input' must be a string, got number", {}),
        (ALPACA, {"instruction": "a", "output": "b", "history": [["x"]]},
         "history[0] must be a pair of strings [user, assistant]", {}),
        (SHAREGPT, ALPACA, "an alpaca record, but the file's first record is sharegpt", {}),
        (ALPACA, SHAREGPT, "a sharegpt record, but sft.format is alpaca", {"format": "alpaca"}),
        ({"q": "a", "completion": "b"}, {"prompt": "a", "completion": "b"},
         "a record needs 'q' (prompt) and 'completion' (prompt_completion); it has 'completion'",
         {"columns": {"prompt": "q"}}),
    ],
)  # fmt: skip
def test_bad_sharegpt_alpaca_and_mapped_records_at_their_line(root, good, bad, message, values):
    cfg = config(root, jsonl(root / "bad.jsonl", good, bad), **values)
    with pytest.raises(ConfigError) as err:
        read_data(cfg)
    assert str(err.value).startswith(f"{cfg.train[0].path}:2: {message}"), str(err.value)


def test_sharegpt_and_alpaca_are_read_as_the_chat_they_hold(root, tokenizer) -> None:
    """The same chat as each format; ShareGPT's speakers as LLaMA-Factory maps them, Alpaca's
    instruction and input joined by a blank line, its history as earlier turns."""
    user, answer = "apple river\n\nstone", "river apple"
    same = {
        "chat": chat(("system", "reverse"), ("user", user), ("assistant", answer)),
        "sharegpt": {"system": "reverse", "conversations": [
            {"from": "human", "value": user}, {"from": "gpt", "value": answer}]},
        "alpaca": {"instruction": "apple river", "input": "stone", "output": answer,
                   "system": "reverse"},
    }  # fmt: skip
    rows = {}
    for name, record in same.items():
        (read,) = read_records(jsonl(root / f"{name}.jsonl", record))
        assert (read.format, read.messages) == (name, same["chat"]["messages"])
        rows[name] = only_row(root, tokenizer, [record])
    for name in ("sharegpt", "alpaca"):
        assert all((rows[name][k] == rows["chat"][k]).all() for k in rows["chat"])
    speakers = (
        "system",
        "human",
        "function_call",
        "observation",
        "gpt",
        "user",
        "assistant",
        "tool",
    )
    turns = {"conversations": [{"from": s, "value": s} for s in speakers]}
    (read,) = read_records(jsonl(root / "turns.jsonl", turns))
    assert [m["role"] for m in read.messages or []] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]  # fmt: skip
    history = {"instruction": "c", "input": "", "output": "d", "history": [["a", "b"]]}
    (read,) = read_records(jsonl(root / "history.jsonl", history))
    assert read.messages == chat(("user", "a"), ("assistant", "b"), ("user", "c"),
                                 ("assistant", "d"))["messages"]  # fmt: skip


def test_columns_read_the_data_own_keys(root, tokenizer) -> None:
    """A mapped key is read from the data's key (a key already named like it is ignored)."""
    pair = {"prompt": "reverse : apple =", "completion": "apple"}
    renamed = {"question": pair["prompt"], "answer": "apple", "prompt": "ignored"}
    dialog = {"dialog": [{"speaker": m["role"], "text": m["content"]} for m in CHAT]}
    for plain, mapped, columns in (
        (pair, renamed, {"prompt": "question", "completion": "answer"}),
        ({"messages": CHAT}, dialog, {"messages": "dialog", "role": "speaker", "content": "text"}),
    ):
        want = only_row(root, tokenizer, [plain])
        got = only_row(root, tokenizer, [mapped], columns=columns)
        assert all((got[k] == want[k]).all() for k in want)


@pytest.mark.parametrize(
    "record", [{"messages": CHAT}, {"prompt": "reverse : apple =", "completion": "apple"}]
)
def test_train_on_prompt_trains_on_every_token_but_padding(root, tokenizer, record) -> None:
    answers_only = only_row(root, tokenizer, [record])
    every = only_row(root, tokenizer, [record], train_on_prompt=True)
    n = int(every["cu_seqlens"][-1])
    assert (every["tokens"] == answers_only["tokens"]).all()
    assert every["loss_mask"][:n].all() and not every["loss_mask"][n:].any()
    assert 0 < answers_only["loss_mask"].sum() < n


def test_weights_mix_files_by_share_from_the_seed(root, tokenizer) -> None:
    """4 + 12 records, weights 5 and 3: 10 from the first (each 2 or 3 times), 6 distinct from
    the second; the same mix for the same seed; without weights, every record once."""
    assert shares([4, 12], [5, 3]) == [10, 6] and shares([3, 4], [1, 2]) == [2, 5]
    files = [jsonl(root / f"{k}.jsonl", *({"prompt": f"{k}{i}", "completion": "x"} for i in range(n)))
             for k, n in (("a", 4), ("b", 12))]  # fmt: skip
    weighted = [{"path": str(files[0]), "weight": 5}, {"path": str(files[1]), "weight": 3}]

    def mixed(**values: Any) -> tuple[list[str], list[str]]:
        train, held = read_data(config(root, weighted, **values))
        return [str(r.prompt) for r in train], [str(r.prompt) for r in held]

    train, _ = mixed()
    a, b = Counter(p for p in train if p[0] == "a"), [p for p in train if p[0] == "b"]
    assert sorted(a.values()) == [2, 2, 3, 3] and len(b) == len(set(b)) == 6
    assert mixed() == (train, []) and mixed(seed=5)[0] != train
    built = build_sft_data(config(root, weighted), tokenizer).train
    assert built.num_samples == 16 and built.loss_tokens == 16 * 2  # "x" and EOS each
    train, held = mixed(eval_fraction=0.25)
    assert len(held) == 4 and len(train) == 12 and not set(train) & set(held)
    plain, _ = read_data(config(root, [str(f) for f in files]))
    assert [r.prompt for r in plain] == [
        *(f"a{i}" for i in range(4)),
        *(f"b{i}" for i in range(12)),
    ]
