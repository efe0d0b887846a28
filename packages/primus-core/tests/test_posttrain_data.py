"""Fine-tuning data: the loss mask against the tokenizer's own chat template, packing, order and
resume, the eval split, truncation, and every bad-data error at its file and line (the other
formats, columns, mixing and train_on_prompt: test_posttrain_formats.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from primus.core.config.posttrain import SFTConfig, sft_config
from primus.core.config.tree import ConfigTree
from primus.core.errors import ConfigError
from primus.core.logging import get_logger
from primus.core.posttrain import SFTDataset, build_sft_data
from primus.core.posttrain.encode import load_tokenizer
from primus.testing.hf_models import make_hf_model
from primus.testing.sft_data import EOT, hf_eval_stats, write_reverse_task, write_tokenizer

# LLAMA3_TEMPLATE with the assistant's content and end of turn marked as `{% generation %}`:
# it renders the same text, and transformers' return_assistant_tokens_mask then gives the
# reference mask.
MARKED = (
    "{% for message in messages %}"
    "{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHAT = [
    {"role": "system", "content": "reverse"},
    {"role": "user", "content": "apple river stone"},
    {"role": "assistant", "content": "stone river apple"},
    {"role": "user", "content": "green lamp"},
    {"role": "assistant", "content": "lamp green"},
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft")
    write_tokenizer(root / "tok")
    write_tokenizer(root / "bare", chat_template=None)
    write_reverse_task(root / "task", n_train=48, n_eval=8, system=True)
    return root


@pytest.fixture(scope="module")
def tokenizer(root: Path) -> Any:
    return load_tokenizer(config(root, root / "task" / "chat_train.jsonl"))


def config(root: Path, train: Path | list[Any], **values: Any) -> SFTConfig:
    section = {
        "train": str(train) if isinstance(train, Path) else train,
        "tokenizer": str(root / "tok"),
        "seq_length": 64,
    } | values
    cfg = sft_config(ConfigTree({"m": {"sft": section}}), ("m",), None)
    assert cfg is not None
    return cfg


def jsonl(path: Path, *records: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def only_row(root: Path, tok: Any, records: list[Any], /, **values: Any) -> dict[str, Any]:
    data = build_sft_data(config(root, jsonl(root / "one.jsonl", *records), **values), tok)
    assert len(data.train) == 1
    return data.train[0]


@pytest.mark.parametrize("given", [False, True], ids=["tokenizer's template", "config's template"])
def test_the_loss_is_exactly_the_assistant_tokens(root, tokenizer, given) -> None:
    """Tokens: the tokenizer's own rendering. Trained on: each assistant message's content and
    its <|eot_id|>, as transformers marks them with {% generation %}, and as spelled out."""
    reference = tokenizer.apply_chat_template(
        CHAT, chat_template=MARKED, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, marked = reference["input_ids"], reference["assistant_masks"]
    assert ids == tokenizer.apply_chat_template(CHAT)["input_ids"]  # MARKED renders the same
    eot = tokenizer.convert_tokens_to_ids(EOT)
    spelled = [
        t
        for m in CHAT
        if m["role"] == "assistant"
        for t in [*tokenizer(m["content"], add_special_tokens=False)["input_ids"], eot]
    ]
    assert [t for t, m in zip(ids, marked, strict=True) if m] == spelled
    values = {"tokenizer": str(root / "bare"), "chat_template": MARKED} if given else {}
    row = only_row(root, tokenizer, [{"messages": CHAT}], **values)
    n = len(ids) - 1
    assert row["tokens"][:n].tolist() == ids[:-1] and row["labels"][:n].tolist() == ids[1:]
    assert row["loss_mask"][:n].tolist() == marked[1:]
    assert not row["loss_mask"][n:].any()


def test_prompt_completion_trains_on_the_completion_and_eos(root, tokenizer) -> None:
    pair = {"prompt": "reverse : apple river =", "completion": "river apple"}
    prompt = tokenizer(pair["prompt"])["input_ids"]
    completion = tokenizer(pair["completion"], add_special_tokens=False)["input_ids"]
    ids = [*prompt, *completion, tokenizer.eos_token_id]
    assert prompt[0] == tokenizer.bos_token_id
    row = only_row(root, tokenizer, [pair])
    n = len(ids) - 1
    assert row["tokens"][:n].tolist() == ids[:-1]
    assert row["labels"][row["loss_mask"] == 1].tolist() == [*completion, tokenizer.eos_token_id]


def samples_of(dataset: SFTDataset, row: dict[str, Any]) -> list[list[int]]:
    """Each sample of a row as its tokens, checked: positions restart, segments count from 1,
    cu_seqlens marks them, labels are the next tokens, padding is never in the loss."""
    cuts = row["cu_seqlens"].tolist()
    assert cuts[0] == 0 and cuts[-1] <= dataset.seq_length
    found = []
    for segment, (start, end) in enumerate(itertools.pairwise(cuts), 1):
        assert (row["segment_ids"][start:end] == segment).all()
        assert row["position_ids"][start:end].tolist() == list(range(end - start))
        assert (row["labels"][start : end - 1] == row["tokens"][start + 1 : end]).all()
        found.append([*row["tokens"][start:end].tolist(), int(row["labels"][end - 1])])
    pad = slice(cuts[-1], None)
    assert not row["segment_ids"][pad].any() and not row["loss_mask"][pad].any()
    assert (row["tokens"][pad] == dataset.pad_id).all() and not row["position_ids"][pad].any()
    return found


def test_packing_keeps_samples_whole_and_apart(root, tokenizer) -> None:
    train = root / "task" / "chat_train.jsonl"
    packed = build_sft_data(config(root, train, packing=True), tokenizer).train
    single = build_sft_data(config(root, train), tokenizer).train
    assert len(single) == single.num_samples == packed.num_samples == 48
    assert len(packed) < 48 / 2 and packed.positions / (len(packed) * 64) > 0.8
    assert packed.loss_tokens == single.loss_tokens
    assert all(len(single.rows[i]) == 1 for i in range(len(single)))
    every = sorted(s for i in range(len(packed)) for s in samples_of(packed, packed[i]))
    assert every == sorted(s for i in range(len(single)) for s in samples_of(single, single[i]))
    assert len({tuple(s) for s in every}) > 40  # the samples, not one repeated
    row = packed[0]
    assert row["loss_mask"].sum() == sum(
        packed.mask[packed.offsets[s] + 1 : packed.offsets[s + 1]].sum() for s in packed.rows[0]
    )


def test_order_is_seeded_epoch_by_epoch_and_resumes_at_a_position(root, tokenizer) -> None:
    cfg = config(root, root / "task" / "chat_train.jsonl", packing=True)
    first, again = (build_sft_data(cfg, tokenizer).train for _ in range(2))
    n = len(first)
    assert sorted(first.order(0)) == sorted(first.order(1)) == list(range(n))
    assert first.order(0) != first.order(1) != list(range(n))
    batch, resumed = first.batch(0, 2 * n), again.batch(n - 3, 5)  # over the epoch boundary
    for key in ("tokens", "labels", "loss_mask", "position_ids", "segment_ids"):
        assert batch[key].shape == (2 * n, 64)
        assert (resumed[key] == batch[key][n - 3 : n + 2]).all()
    other = build_sft_data(config(root, cfg.train[0].path, packing=True, seed=5), tokenizer).train
    assert other.order(0) != first.order(0)


def test_eval_split_holds_out_a_seeded_share(root, tokenizer) -> None:
    cfg = config(root, root / "task" / "chat_train.jsonl", eval_fraction=0.25)
    data = build_sft_data(cfg, tokenizer)
    assert data.eval is not None and (data.train.num_samples, data.eval.num_samples) == (36, 12)
    tokens = {d: {tuple(d.tokens[d.offsets[i] : d.offsets[i + 1]]) for i in range(d.num_samples)}
              for d in (data.train, data.eval)}  # fmt: skip
    assert not tokens[data.train] & tokens[data.eval]
    again = build_sft_data(cfg, tokenizer).eval
    assert again is not None and (again.tokens == data.eval.tokens).all()
    files = build_sft_data(config(root, cfg.train[0].path, eval=str(root / "task" / "chat_eval.jsonl")),
                           tokenizer)  # fmt: skip
    assert files.eval is not None and files.eval.num_samples == 8


def test_truncation_cuts_long_samples_and_drops_those_left_without_loss(
    root, tokenizer, caplog
) -> None:
    words = " ".join(["apple"] * 20)
    records = [
        {"prompt": "reverse :", "completion": words},  # 23 tokens, the completion cut
        {"prompt": words, "completion": "river"},  # 23 tokens, the completion cut off
        {"prompt": "reverse :", "completion": "river"},
    ]
    cfg = config(root, jsonl(root / "long.jsonl", *records), seq_length=12, truncate=True)
    get_logger().addHandler(caplog.handler)  # the primus logger does not propagate
    try:
        data = build_sft_data(cfg, tokenizer)
    finally:
        get_logger().removeHandler(caplog.handler)
    assert data.dropped == 1 and data.train.num_samples == 2
    assert "sft.truncate: dropped 1 of 3 train records" in caplog.text  # said, not silent
    assert data.train.positions == 12 + 4 and data.train.loss_tokens == 12 - 2 + 2


def chat(*messages: tuple[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages]}


GOOD = chat(("user", "apple"), ("assistant", "apple"))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"messages": [', "not valid JSON: Expecting value (column 15)"),
        ("[1, 2]", "a record must be a JSON object, got array"),
        ({"text": "apple"}, "a record needs 'messages' (chat); it has 'text'"),
        ({"messages": [], "prompt": "a", "completion": "b"},
         "a record with the keys of several formats: chat and prompt_completion"),
        ({"messages": []}, "'messages' must be a non-empty array, got an empty one"),
        ({"messages": [{"content": "apple"}]}, "messages[0] has no 'role'"),
        (chat(("user", "apple"), ("robot", "x")), "messages[1] has unknown role 'robot'"),
        (chat(("user", 5)), "messages[0] 'content' must be a string, got number"),
        ({"messages": [{"role": "user"}]}, "messages[0] 'content' must be a string, got none"),
        (chat(("user", None)), "messages[0] 'content' must be a string, got null"),  # JSON's name
        ({"messages": ["apple"]}, "messages[0] is not an object, got string"),
        ({"prompt": "a", "completion": "b"}, "a prompt_completion record, but the file's first record is chat"),
        (chat(("user", "apple river")), "messages has no assistant message: nothing to train on"),
        (chat(("user", "apple"), ("assistant", " ".join(["river"] * 70))),
         "sample is 80 tokens, more than seq_length + 1 = 65"),
    ],
)  # fmt: skip
def test_bad_data_is_named_by_file_and_line(root, tokenizer, bad, message) -> None:
    path = jsonl(root / "bad.jsonl", GOOD, "", bad, GOOD)
    with pytest.raises(ConfigError) as err:
        build_sft_data(config(root, path), tokenizer)
    assert message in str(err.value)
    assert err.value.origin is not None and err.value.origin.line == 3
    assert str(err.value).startswith(f"{path}:3: ")


def test_a_byte_order_mark_is_read_and_bytes_that_are_not_utf8_are_named(root, tokenizer) -> None:
    """Windows tools write JSONL with a byte-order mark (and CRLF); a Latin-1 file is refused
    at its line and column, not with a traceback."""
    lines = [json.dumps(GOOD)] * 4
    marked = root / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    assert len(build_sft_data(config(root, marked), tokenizer).train.rows) == 4
    latin = root / "latin.jsonl"
    latin.write_bytes("\n".join(lines).encode() + b'\n{"x": "caf\xe9"}\n')
    with pytest.raises(ConfigError) as err:
        build_sft_data(config(root, latin), tokenizer)
    assert str(err.value).startswith(f"{latin}:5: not UTF-8 text: byte 0xe9 at column 11\n")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% if loop.last %}<|eot_id|>{% endif %}{% endfor %}",
         "messages[1]: the chat template of sft.chat_template renders messages[:1] "
         "with the generation prompt as text that is not a prefix of its rendering of messages[:2]"),
        ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}",
         "renders no assistant tokens for this chat"),
        ("{{ raise_exception('roles must alternate') }}", "failed: roles must alternate"),
    ],
)  # fmt: skip
def test_a_template_that_hides_the_assistant_tokens_is_refused(root, tokenizer, template, message):
    path = jsonl(root / "bad.jsonl", GOOD)
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: ") as err:
        build_sft_data(config(root, path, chat_template=template), tokenizer)
    assert message in str(err.value)


def test_a_chat_needs_a_template(root, tokenizer) -> None:
    cfg = config(root, jsonl(root / "one.jsonl", GOOD), tokenizer=str(root / "bare"))
    with pytest.raises(ConfigError, match=r"has no chat template, and .*one\.jsonl:1 is a chat"):
        build_sft_data(cfg)  # loads the bare tokenizer itself


def test_parquet_reads_like_jsonl_and_names_bad_rows(root, tokenizer) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for kind in ("chat", "pc"):
        source = root / "task" / f"{kind}_train.jsonl"
        records = [json.loads(line) for line in source.read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(records), root / f"{kind}.parquet")
        rows = [
            build_sft_data(config(root, p), tokenizer).train
            for p in (source, root / f"{kind}.parquet")
        ]
        assert (rows[0].tokens == rows[1].tokens).all() and (rows[0].mask == rows[1].mask).all()
    pq.write_table(pa.Table.from_pylist([GOOD, chat(("robot", "x"))]), root / "bad.parquet")
    with pytest.raises(ConfigError) as err:
        build_sft_data(config(root, root / "bad.parquet"), tokenizer)
    assert str(err.value).startswith(
        f"{root / 'bad.parquet'}: row 1: messages[0] has unknown role 'robot'"
    )


def test_positions_and_masks_as_arrays(root, tokenizer) -> None:
    row = only_row(root, tokenizer, [GOOD])
    assert {k: v.dtype for k, v in row.items()} == {
        "tokens": np.int32, "labels": np.int32, "position_ids": np.int32,
        "segment_ids": np.int32, "loss_mask": np.float32, "cu_seqlens": np.int32,
    }  # fmt: skip


def test_the_hf_reference_agrees_with_transformers_own_masked_loss(root, tokenizer) -> None:
    """hf_eval_stats over rows == transformers' loss with labels -100 outside the mask, summed
    per sample: the rows' shift and mask are what transformers means by them."""
    import torch
    from transformers import AutoModelForCausalLM

    make_hf_model(root / "hf", "llama3")
    lines = (root / "task" / "chat_eval.jsonl").read_text().splitlines()[:3]
    three = jsonl(root / "three.jsonl", *map(json.loads, lines))
    data = build_sft_data(config(root, three), tokenizer).train
    stats = hf_eval_stats(root / "hf", data)
    model = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    loss_sum = count = 0.0
    for first, last in itertools.pairwise(data.offsets.tolist()):
        tokens = torch.as_tensor(data.tokens[first:last], dtype=torch.long)[None]
        labels = tokens.masked_fill(torch.as_tensor(data.mask[first:last])[None] == 0, -100)
        with torch.no_grad():
            loss = model(tokens, labels=labels).loss
        targets = int((labels[0, 1:] != -100).sum())
        loss_sum, count = loss_sum + float(loss) * targets, count + targets
    assert stats.count == count == data.loss_tokens
    assert stats.loss == pytest.approx(loss_sum / count, rel=1e-5)
    assert 0 <= stats.accuracy < 0.5  # random weights
