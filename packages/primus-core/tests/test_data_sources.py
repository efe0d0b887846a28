"""The inputs of `primus data prepare` refused when they are listed, before any tokenizing: what
the JSON Lines reader would take and fail on later, chunk by chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.core.data.sources import expand
from primus.core.errors import ConfigError


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("a.json", b'[{"text": "a"},\n {"text": "b"}]\n', "one JSON array; data prepare reads "
         "JSON Lines"),
        ("c.jsonl.gz", b"\x1f\x8b\x08\x00", r"a compressed file \(.gz\) is not read"),
        ("c.jsonl.zst", b"\x28\xb5\x2f\xfd", r"a compressed file \(.zst\) is not read"),
    ],
)  # fmt: skip
def test_an_array_or_a_compressed_file_is_refused_naming_it(
    tmp_path: Path, name: str, data: bytes, said: str
) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ConfigError, match=f"{name}: {said}"):
        expand([str(tmp_path / name)])


def test_json_lines_under_any_name_are_listed(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"text": "a"}\n{"text": "b"}\n')
    (tmp_path / "b.txt").write_text("plain text")
    assert [s.kind for s in expand([str(tmp_path / "a.json"), str(tmp_path / "b.txt")])] == [
        "jsonl",
        "txt",
    ]


@pytest.mark.parametrize("config", [b"{not json", b"[1]", b"\xff\xfe"])
def test_a_tokenizer_config_that_is_not_an_object_is_refused_not_skipped(
    tmp_path: Path, config: bytes
) -> None:
    pytest.importorskip("tokenizers")
    from primus.core.data.tokenizer import find_eod, load_tokenizer

    shipped = Path(__file__).parents[3] / "configs/data/sft-tiny/tokenizer/tokenizer.json"
    (tmp_path / "tokenizer.json").write_bytes(shipped.read_bytes())
    (tmp_path / "tokenizer_config.json").write_bytes(config)
    tokenizer, directory = load_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json: not a JSON object") as err:
        find_eod(tokenizer, directory)  # else its eos_token silently gave way to another
    assert "--eod-token" in str(err.value.hint)
    assert find_eod(tokenizer, directory, "<|eot_id|>").source == "--eod-token"
