"""`primus data prepare` where a corpus already is: the same inputs and settings find it
prepared and do nothing; others are refused, naming its files, unless --overwrite; a run that
fails midway leaves the old corpus as it was. The shipped tokenizer, the CLI in process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from primus.testing.corpus import write_jsonl
from primus.testing.in_process import primus_here

TOKENIZER = Path(__file__).parents[3] / "configs" / "data" / "sft-tiny" / "tokenizer"


def prepare(tmp_path: Path, *args: str) -> tuple[int, str]:
    """`primus data prepare ARGS -o out/c` in process (one worker): its exit code, and its
    output (stderr's box unwrapped)."""
    done = primus_here("data", "prepare", "-t", str(TOKENIZER), "-o", str(tmp_path / "out" / "c"),
                       "--workers", "1", *args, cwd=tmp_path)  # fmt: skip
    said = done.stdout + " ".join(re.sub("[│╭╮╰╯─]", " ", done.stderr).split())
    return done.returncode, said


def texts(n: int, shift: int = 0) -> list[str]:
    """`n` texts of the shipped tokenizer's words."""
    words = ["apple", "river", "stone", "cloud", "green", "quick", "lamp", "north", "paper",
             "seven"]  # fmt: skip
    return [" ".join(words[(i + shift) % 10 :]) for i in range(n)]


def corpus(tmp_path: Path) -> list[bytes]:
    """The bytes of out/c.bin, .idx and .json."""
    return [Path(f"{tmp_path / 'out' / 'c'}.{suffix}").read_bytes() for suffix in ("bin", "idx", "json")]  # fmt: skip


def test_the_same_run_again_does_nothing_and_another_needs_overwrite(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", texts(30))
    b = write_jsonl(tmp_path / "b.jsonl", texts(30, shift=3))
    assert prepare(tmp_path, str(a))[0] == 0
    first = corpus(tmp_path)
    code, said = prepare(tmp_path, str(a), "--chunk-size", "1K")  # the bytes do not change
    assert code == 0 and said.startswith("already prepared from these inputs and settings: 30 ")
    assert corpus(tmp_path) == first  # not written again

    prefix = tmp_path / "out" / "c"
    files = f"({prefix}.bin, {prefix}.idx, {prefix}.json)"
    for args, why in [
        ((str(b),), f"made from other input files (input 1 was {a}, here {b})"),
        ((str(a), str(b)), f"made from other input files (input 2 was none, here {b})"),
        ((str(a), "--no-append-eod"), "made with end-of-document id 4, not no end-of-document id"),
        ((str(a), "--key", "id"), 'made from the key "text", not "id"'),
    ]:
        code, said = prepare(tmp_path, *args)
        assert code == 2, said
        assert f"error: {prefix} already holds a corpus {files} {why}: pass --overwrite" in said
    assert corpus(tmp_path) == first

    a.write_text(a.read_text().replace("apple", "tiger"))  # the same size, other content
    assert f"{files} made before {a} changed: pass --overwrite" in prepare(tmp_path, str(a))[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": 3}) + "\n")
    code, said = prepare(tmp_path, str(bad), "--overwrite")  # fails midway
    assert code == 2 and "must be a string, got number" in said
    assert corpus(tmp_path) == first  # the old corpus, whole; no half-written one beside it
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["c.bin", "c.idx", "c.json"]
    assert prepare(tmp_path, str(a), "--overwrite")[0] == 0
    assert corpus(tmp_path)[0] != first[0]
    assert prepare(tmp_path, str(a))[1].startswith("already prepared")


def test_a_corpus_without_a_sound_manifest_is_not_taken_for_prepared(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", texts(20))
    assert prepare(tmp_path, str(a))[0] == 0
    manifest = tmp_path / "out" / "c.json"
    for damage, why in [
        ('{"format": "indexed", "vocab_size": 61}', "manifest: documents is missing): pass"),
        ("{garbage", "without a manifest that says what made it"),
        (None, "that lacks c.json"),
    ]:  # fmt: skip
        manifest.unlink() if damage is None else manifest.write_text(damage)
        code, said = prepare(tmp_path, str(a))
        assert code == 2 and why in said and "pass --overwrite" in said, said
    assert prepare(tmp_path, str(a), "--overwrite")[0] == 0
