"""A prepared corpus's files checked before a run or by `primus data inspect`: the index and
the tokens it covers, every index entry, the manifest's fields and its vocabulary against the
ids. Corpora written with numpy here; no tokenizer."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from primus.cli.main import main
from primus.core.data import indexed
from primus.core.data.indexed import IndexedCorpus, entries_problem, index_problem
from primus.core.data.manifest import FORMAT, read_manifest
from primus.core.errors import ConfigError

LENGTHS = np.arange(1, 11, dtype=np.int32)  # ten documents, 55 tokens


def corpus(prefix: Path, vocab: int = 64, tokens: np.ndarray | None = None) -> Path:
    """PREFIX.bin/.idx of LENGTHS (ids below `vocab`, or `tokens`) and a manifest."""
    whole = io.BytesIO()
    indexed.write_index(whole, io.BytesIO(LENGTHS.tobytes()), "int32")
    Path(f"{prefix}.idx").write_bytes(whole.getvalue())
    ids = np.arange(55, dtype=np.int32) % vocab if tokens is None else tokens
    Path(f"{prefix}.bin").write_bytes(ids.tobytes())
    manifest = {"format": FORMAT, "vocab_size": vocab, "documents": 10, "tokens": 55,
                "dtype": "int32", "eod": {"id": 0}, "tokenizer": None}  # fmt: skip
    Path(f"{prefix}.json").write_text(json.dumps(manifest))
    return prefix


def test_index_in_blocks_and_its_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = io.BytesIO(LENGTHS.tobytes())
    whole = io.BytesIO()
    assert indexed.write_index(whole, sizes, "int32") == 10
    monkeypatch.setattr(indexed, "BLOCK", 3)
    blocks = io.BytesIO()
    indexed.write_index(blocks, sizes, "int32")
    assert blocks.getvalue() == whole.getvalue()

    idx, data = tmp_path / "c.idx", tmp_path / "c.bin"
    idx.write_bytes(whole.getvalue())
    data.write_bytes(np.arange(55, dtype=np.int32)[:-1].tobytes())  # the last token cut
    assert index_problem(idx, data) == f"{data} is truncated: 216 bytes, its index c.idx needs 220"
    data.write_bytes(np.arange(55, dtype=np.int32).tobytes())
    assert index_problem(idx, data) is None
    assert entries_problem(idx, data) is None  # in blocks of 3 entries
    read = IndexedCorpus(tmp_path / "c")
    assert (len(read), read.token_count, read[3].tolist()) == (10, 55, [6, 7, 8, 9])
    data.write_bytes(np.arange(56, dtype=np.int32).tobytes())  # a token past the last document
    assert index_problem(idx, data) is None  # Megatron's reader takes it: a run does too
    assert entries_problem(idx, data) == (
        f"{data} holds 4 bytes past the last document of its index c.idx: they are not one corpus"
    )
    idx.write_bytes(b"junk" * 20)
    assert "not an index file of the indexed format" in str(index_problem(idx, data))


@pytest.mark.parametrize("block", [3, 1 << 20])
def test_a_damaged_index_entry_is_found_in_any_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(indexed, "BLOCK", block)
    prefix = corpus(tmp_path / "c")
    idx = Path(f"{prefix}.idx")
    raw = bytearray(idx.read_bytes())
    raw[indexed.HEADER_BYTES : indexed.HEADER_BYTES + 4] = np.int32(-5).tobytes()  # document 0
    idx.write_bytes(bytes(raw))
    assert index_problem(idx, Path(f"{prefix}.bin")) is None  # the last entry is sound
    assert entries_problem(idx, Path(f"{prefix}.bin")) == (
        f"{idx} is damaged: document 0 has -5 tokens at byte 0, where the documents before it "
        "end at byte 0"
    )
    raw = bytearray(corpus(tmp_path / "d").with_suffix(".idx").read_bytes())
    pointer = indexed.HEADER_BYTES + 10 * 4 + 4 * 8  # document 4's pointer
    raw[pointer : pointer + 8] = np.int64(0).tobytes()
    Path(tmp_path / "d.idx").write_bytes(bytes(raw))
    assert entries_problem(tmp_path / "d.idx", tmp_path / "d.bin") == (
        f"{tmp_path / 'd.idx'} is damaged: document 4 has 5 tokens at byte 0, where the "
        "documents before it end at byte 40"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"vocab_size": "abc"}, 'vocab_size must be a positive integer, got "abc"'),
        ({"vocab_size": None}, "vocab_size must be a positive integer, got null"),
        ({"vocab_size": [1]}, r"vocab_size must be a positive integer, got \[1\]"),
        ({"vocab_size": True}, "vocab_size must be a positive integer, got true"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
        ({"documents": -1}, "documents must be an integer, 0 or more, got -1"),
        ({"tokens": 5.5}, "tokens must be an integer, 0 or more, got 5.5"),
        ({"dtype": {}}, r"dtype must be a string, got \{\}"),
        ({"eod": "x"}, "eod must be null or hold the end-of-document id"),
        ({"eod": {"id": -1}}, "eod must be null or hold the end-of-document id"),
        ({"eod": {"id": 64}}, "the end-of-document id 64 is outside its vocabulary of 64"),
        ({"tokenizer": "x"}, r'tokenizer must be null or an object \(path, sha256\), got "x"'),
    ],
)
def test_a_manifest_with_a_bad_field_is_one_config_error(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    prefix = corpus(tmp_path / "c")
    good = json.loads(Path(f"{prefix}.json").read_text())
    Path(f"{prefix}.json").write_text(json.dumps(good | fields))
    with pytest.raises(ConfigError, match=message) as err:
        read_manifest(prefix)
    assert str(err.value).startswith(f"{prefix}.json, the corpus's manifest: ")
    for name in ("vocab_size", "documents", "tokens", "dtype"):  # a damaged or foreign one
        Path(f"{prefix}.json").write_text(json.dumps({k: v for k, v in good.items() if k != name}))
        with pytest.raises(ConfigError, match=f"manifest: {name} is missing"):
            read_manifest(prefix)
    Path(f"{prefix}.json").write_text(json.dumps({"format": "other"}))
    assert read_manifest(prefix) is None  # JSON of another format: no manifest


def test_inspect_checks_the_ids_against_the_manifest_and_every_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = corpus(tmp_path / "good")
    with pytest.raises(SystemExit) as done:
        main(["data", "inspect", str(good)])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("10 documents, 55 tokens")
    big = corpus(tmp_path / "big", tokens=np.full(55, 60000, dtype=np.int32))
    with pytest.raises(SystemExit) as done:
        main(["data", "inspect", str(big)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"{big}.bin holds token id 60000, outside its manifest's vocabulary of 64" in err
    assert "Traceback" not in err
    manifest = json.loads(Path(f"{good}.json").read_text())
    del manifest["documents"]  # what inspect checks the corpus against
    Path(f"{good}.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as done:
        main(["data", "inspect", str(good)])
    assert done.value.code == 2
    assert f"error: {good}.json, the corpus's manifest: documents is missing" in (
        capsys.readouterr().err
    )
    Path(f"{good}.idx").unlink()
    Path(f"{good}.idx").mkdir()
    with pytest.raises(SystemExit) as done:
        main(["data", "inspect", str(good)])
    assert done.value.code == 2
    assert f"error: {good}.idx is not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # the folder that holds corpora: it names them
        main(["data", "inspect", str(tmp_path)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path} is a folder: name a corpus prefix" in err
    assert f"hint: the corpora in it: {big}\n" in err  # not good, whose .idx is a folder now


def test_config_validate_refuses_a_damaged_manifest_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = corpus(tmp_path / "c")
    Path(f"{prefix}.json").write_text(json.dumps({"format": FORMAT, "vocab_size": "abc"}))
    recipe = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    with pytest.raises(SystemExit) as done:
        main(["config", "validate", str(recipe), f"data.path={prefix}", "data.seq_length=4"])
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert f"{prefix}.json, the corpus's manifest: vocab_size must be a positive integer" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("documents", 7, "documents 7, the corpus has 10"), ("tokens", 5, "tokens 5, the corpus "
     "has 55"), ("dtype", "uint16", "dtype 'uint16', the corpus has 'int32'"),
],
)  # fmt: skip
def test_inspect_refuses_a_manifest_of_another_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, said: str
) -> None:
    """A corpus prepared again without its manifest, or a manifest copied from another."""
    prefix = corpus(tmp_path / "c")
    manifest = json.loads(Path(f"{prefix}.json").read_text())
    Path(f"{prefix}.json").write_text(json.dumps(manifest | {field: value}))
    with pytest.raises(SystemExit) as done:
        main(["data", "inspect", str(prefix)])
    assert done.value.code == 2
    assert f"error: its manifest ({prefix}.json) says {said}" in capsys.readouterr().err
