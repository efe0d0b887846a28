"""The records' check before any framework is imported (`primus.core.posttrain.check`, what
`config validate`, a dry run and a run call): a sample too long for a row, a blank answer, a
pair that renders alike, and files that are not JSON Lines, each refused at its file:line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from primus.core.errors import ConfigError
from primus.core.posttrain import build_pair_data, build_sft_data
from primus.core.posttrain.check import check_records

from .test_posttrain_data import GOOD, chat, config, jsonl
from .test_posttrain_data import root as root  # the fixtures
from .test_posttrain_data import tokenizer as tokenizer

LONG = chat(("user", "apple"), ("assistant", " ".join(["river"] * 70)))  # 80 tokens


def refusal(cfg: Any) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        check_records(cfg)
    return err.value


def test_a_sample_too_long_is_refused_before_the_build(root: Path, tokenizer: Any) -> None:
    """The validation's count is the build's: same file:line, same lengths; with
    sft.truncate the record is cut at build, not refused."""
    path = jsonl(root / "long.jsonl", GOOD, "", LONG, GOOD)
    said = str(refusal(config(root, path)))
    assert said.startswith(f"{path}:3: sample is 80 tokens, more than seq_length + 1 = 65\n")
    assert "hint: set sft.truncate: true to cut it, or a larger sft.seq_length" in said
    with pytest.raises(ConfigError) as built:
        build_sft_data(config(root, path), tokenizer)
    assert str(built.value) == said
    check_records(config(root, path, truncate=True))
    assert build_sft_data(config(root, path, truncate=True), tokenizer).train.num_samples == 3
    check_records(config(root, path, seq_length=79))  # 80 tokens fill 79 positions
    evals = config(root, jsonl(root / "ok.jsonl", GOOD), eval=str(path))
    assert refusal(evals).origin.line == 3  # type: ignore[union-attr]


def test_only_the_first_records_are_counted_before_the_build(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Counting costs what the build's encoding costs: a large corpus is counted once, at
    build, past its first COUNTED records (every record's format is still checked)."""
    import primus.core.posttrain.check as check

    monkeypatch.setattr(check, "COUNTED", 2)
    caplog.set_level("INFO", logger="primus")
    check_records(config(root, jsonl(root / "late.jsonl", GOOD, GOOD, LONG)))
    assert "the first 2 of 3 records' lengths checked" in caplog.text
    assert refusal(config(root, jsonl(root / "early.jsonl", GOOD, LONG, GOOD))).origin.line == 2  # type: ignore[union-attr]
    bad = jsonl(root / "bad.jsonl", GOOD, GOOD, {"messages": []})
    assert refusal(config(root, bad)).origin.line == 3  # type: ignore[union-attr]


def test_a_prompt_completion_too_long_is_refused_at_its_line(root: Path, tokenizer: Any) -> None:
    """Counted without the prompt's BOS, so never above the build's count (here: one less)."""
    words = " ".join(["apple"] * 70)
    path = jsonl(root / "pc.jsonl", {"prompt": "a", "completion": "b"},
                 {"prompt": "reverse :", "completion": words})  # fmt: skip
    assert str(refusal(config(root, path))).startswith(
        f"{path}:2: sample is at least 73 tokens, more than seq_length + 1 = 65"
    )
    with pytest.raises(ConfigError, match=r"pc\.jsonl:2: sample is 74 tokens"):
        build_sft_data(config(root, path), tokenizer)


PROMPT = [{"role": "user", "content": "apple river"}]
ANSWER = [{"role": "assistant", "content": "river apple"}]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "a", "chosen": " ".join(["river"] * 70), "rejected": "b"},
         "the chosen answer's sample is at least 72 tokens, more than seq_length + 1 = 65"),
        ({"prompt": PROMPT, "chosen": ANSWER,
          "rejected": [{**ANSWER[0], "name": "x"}]},  # a key the template does not render
         "'chosen' and 'rejected' render the same after the prompt"),
        ({"prompt": "a", "chosen": [{"role": "assistant", "content": " "}], "rejected": ANSWER},
         "chosen[0] is an assistant message with only whitespace"),
        ({"prompt": "a", "chosen": "  ", "rejected": "b"},
         "'chosen' must be a non-empty string, got only whitespace '  '"),
    ],
)  # fmt: skip
def test_preference_records_refused_before_the_build(root: Path, record: Any, message: str) -> None:
    path = jsonl(root / "pairs.jsonl", {"prompt": "a", "chosen": "b", "rejected": "c"}, record)
    cfg = config(root, path, format="preference")
    said = str(refusal(cfg))
    assert said.startswith(f"{path}:2: {message}"), said


def test_a_pair_of_the_same_tokens_is_refused_by_the_build(root: Path, tokenizer: Any) -> None:
    path = jsonl(root / "same.jsonl", {"prompt": PROMPT, "chosen": ANSWER,
                                       "rejected": [{**ANSWER[0], "name": "x"}]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"same\.jsonl:1: 'chosen' and 'rejected' are the same "):
        build_pair_data(config(root, path, format="preference"), tokenizer)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (chat(("user", "a"), ("assistant", "")),
         "messages[1] is an assistant message with empty content: it would train the model "
         "to answer with nothing"),
        (chat(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", " \n")),
         "messages[3] is an assistant message with only whitespace"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": ""}],
          "system": "s"}, "conversations[1] is an assistant message with empty content"),
        ({"instruction": "a", "output": " "}, "'output' must be a non-empty string, got only whitespace"),
        ({"instruction": "a", "output": "b", "history": [["c", ""]]}, "history[0]'s answer is empty"),
        ({"prompt": "a", "completion": "\t"}, "'completion' must be a non-empty string, got only"),
        (chat(("user", "a"), ("asistant", "b")), "messages[1] has unknown role 'asistant' (did you mean: assistant?)"),
    ],
)  # fmt: skip
def test_a_blank_answer_is_refused_at_its_line(root: Path, bad: Any, message: str) -> None:
    path = jsonl(root / "blank.jsonl", bad)
    assert str(refusal(config(root, path))).startswith(f"{path}:1: {message}")


def test_a_tool_call_may_have_empty_content(root: Path, tokenizer: Any) -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}
    record = {"messages": [{"role": "user", "content": "a"}, call,
                           {"role": "tool", "content": "b"}, {"role": "assistant", "content": "c"}]}  # fmt: skip
    check_records(config(root, jsonl(root / "tool.jsonl", record)))


GOOD_LINE = json.dumps(GOOD).encode()
SURROGATE = (
    b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "b"}]}'
)


@pytest.mark.parametrize(
    ("content", "line", "message", "hint"),
    [
        (b"", None, "no records (it is empty)", "one record per line"),
        (b"\n  \n\n", None, "no records (only blank lines)", "one record per line"),
        (b"[" + GOOD_LINE + b", " + GOOD_LINE + b"]\n", 1, "a record must be a JSON object, got array",
         "a JSON array of records?"),
        (b"[\n" + GOOD_LINE + b",\n]\n", 1, "not valid JSON: Expecting value (column 2)",
         "a JSON array, or an object over several lines?"),
        (GOOD_LINE + b"\r" + GOOD_LINE + b"\r", 1, "not valid JSON: Extra data",
         "carriage return (\\r) alone?"),
        (GOOD_LINE + b"\n\x00\x00\n", 2, "a NUL byte (0x00) at column 1: not text", "cut off"),
        (GOOD_LINE + b"\n\xef\xbb\xbf" + GOOD_LINE + b"\n", 2, "a byte-order mark (U+FEFF) starts "
         "the line", "files joined with cat"),
        ("\n".join([json.dumps(GOOD)] * 2).encode("utf-16"), 1, "not UTF-8 text: byte 0xff at "
         "column 1: a UTF-16 file", "save the file as UTF-8"),
        (b"\x1f\x8b\x08\x00", 1, "not UTF-8 text: byte 0x8b at column 2: a gzip-compressed file",
         "save the file as UTF-8"),
        (GOOD_LINE + b"\n" + SURROGATE + b"\n", 2, "a string holds half a UTF-16 surrogate pair",
         "cut a character in two"),
    ],
    ids=["empty", "blank-lines", "array", "pretty-array", "cr-endings", "nul", "bom-in-the-middle",
         "utf-16", "gzip", "lone-surrogate"],
)  # fmt: skip
def test_a_file_that_is_not_json_lines_says_what_it_is(
    root: Path, content: bytes, line: int | None, message: str, hint: str
) -> None:
    path = root / "odd.jsonl"
    path.write_bytes(content)
    err = refusal(config(root, path))
    assert str(err).startswith(f"{path}:{line}: {message}" if line else f"{path}: {message}")
    assert err.hint is not None and hint in err.hint, err.hint
    assert "Traceback" not in str(err)


def test_a_dry_run_refuses_a_long_record_without_importing_torch(tmp_path: Path) -> None:
    """`primus train posttrain --dry-run` of a shipped recipe: exit 2 at the long record's
    line, torch never imported (the tokenizer is loaded without it), nothing written."""
    from primus.testing.hf_models import make_hf_model
    from primus.testing.runs import primus_imports
    from primus.testing.sft_data import write_tokenizer
    from primus.testing.sft_runs import REPO, sft_experiment

    hf = make_hf_model(tmp_path / "hf", "llama3")
    write_tokenizer(hf)
    data = jsonl(tmp_path / "train.jsonl", GOOD, LONG)
    task = {"hf": hf, "chat_train": data, "chat_eval": jsonl(tmp_path / "eval.jsonl", GOOD)}
    exp = sft_experiment(
        REPO / "configs" / "megatron" / "sft-tiny-cpu.yaml", tmp_path / "exp", task
    )
    done, imported = primus_imports("train", "posttrain", "--dry-run", "--config", str(exp))
    assert done.returncode == 2 and "torch" not in imported, done.stderr[-3000:]
    assert f"{data}:2: sample is 80 tokens, more than seq_length + 1 = 33" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "exp" / "ws").exists()
