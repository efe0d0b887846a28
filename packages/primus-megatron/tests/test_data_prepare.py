"""`primus data prepare`: a local tokenizer, a generated corpus, Megatron's reader on the result."""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from primus.backends.megatron.data.inputs import index_problem
from primus.backends.megatron.data.prepare import find_eod, load_tokenizer, read_documents
from primus.core.errors import ConfigError

WORDS = ["alpha", "beta", "gamma", "delta", "layer", "token", "model", "rope", "über", "数据"]


def corpus_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(n)]
    texts[5] = texts[77] = ""  # empty documents are skipped, as Megatron does
    return texts


def write_corpus(path: Path, texts: list[str], bad_line: int | None = None) -> Path:
    lines = [json.dumps({"id": i, "text": t}, ensure_ascii=False) for i, t in enumerate(texts)]
    lines.insert(10, "")  # blank lines are not documents
    if bad_line is not None:
        lines[bad_line - 1] = '{"id": 1, "text": "no closing quote}'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_tokenizer(special: list[str], vocab_size: int = 300) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", *special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(500, seed=1), trainer)
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face tokenizer directory whose eos_token only tokenizer_config.json names."""
    directory = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(["<doc_end>"]).save(str(directory / "tokenizer.json"))
    config = {"eos_token": {"content": "<doc_end>", "special": True}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


# One process (one megatron import): prepare through the CLI's main(), the same function
# `python -m primus.cli` runs; fail a second run mid-way; read the result back with Megatron.
ROUND_TRIP = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    from primus.cli.main import main

    def primus(*args):
        try:
            main(list(args))
        except SystemExit as exc:
            return exc.code or 0

    corpus, bad, tokenizer, prefix, vocab, eod = sys.argv[1:]
    assert primus("data", "prepare", "--input", corpus, "--tokenizer", tokenizer,
                  "--output", prefix, "--workers", "2") == 0
    before = open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read()
    failed = primus("data", "prepare", "-i", bad, "-t", tokenizer, "-o", prefix)
    after = open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read()

    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    dataset = IndexedDataset(prefix)
    null = build_tokenizer(SimpleNamespace(
        tokenizer_type="NullTokenizer", vocab_size=int(vocab), null_tokenizer_eod_id=int(eod),
        pad_vocab_size=False))
    print("RESULT", json.dumps({
        "docs": [dataset[i].tolist() for i in range(len(dataset))],
        "document_indices": dataset.document_indices.tolist(),
        "dtype": dataset.index.dtype.__name__,
        "failed_exit": failed,
        "unchanged": before == after,
        "null_eod": null.eod, "null_vocab": null.vocab_size,
    }))
""")


@pytest.mark.slow
def test_prepare_writes_what_megatron_reads(tmp_path: Path, tokenizer_dir: Path) -> None:
    texts = corpus_texts(2100)  # three batches
    corpus = write_corpus(tmp_path / "corpus.jsonl", texts)
    bad = write_corpus(tmp_path / "bad.jsonl", texts, bad_line=1500)  # fails in batch two
    prefix = tmp_path / "out" / "corpus"
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab, eod = tokenizer.get_vocab_size(), tokenizer.token_to_id("<doc_end>")
    args = [corpus, bad, tokenizer_dir, prefix, vocab, eod]
    result = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PRIMUS_DEBUG"},
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.rsplit("RESULT ", 1)[1])

    expected = [[*tokenizer.encode(t).ids, eod] for t in texts if t]
    assert out["docs"] == expected
    assert out["document_indices"] == list(range(len(expected) + 1))
    assert out["dtype"] == "uint16"
    assert f"EOD token: '<doc_end>' id {eod} (eos_token in tokenizer_config.json)" in result.stderr
    assert "2,100 docs" in result.stderr and "tokens" in result.stderr
    tokens = sum(map(len, expected))
    assert f"prepared {len(expected):,} documents (2 empty, skipped), {tokens:,} tokens" in (
        result.stdout
    )
    for line in (
        f"  data_path: {prefix}",
        "  tokenizer_type: NullTokenizer",
        f"  vocab_size: {vocab}",
        f"  null_tokenizer_eod_id: {eod}",
    ):
        assert line + "\n" in result.stdout
    # Those params give Megatron a tokenizer with this EOD id.
    assert (out["null_eod"], out["null_vocab"]) == (eod, vocab)
    # The failed run: exit 2 at the bad line; the earlier files are untouched, no leftovers.
    assert out["failed_exit"] == 2 and out["unchanged"]
    assert "bad.jsonl:1500: not valid JSON" in result.stderr
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["corpus.bin", "corpus.idx"]
    # The fast check before Megatron is imported reads this corpus as Megatron does, and sees
    # the last token gone.
    idx, data = prefix.with_suffix(".idx"), prefix.with_suffix(".bin")
    assert index_problem(idx, data) is None
    data.write_bytes(data.read_bytes()[:-2])
    assert index_problem(idx, data) == (
        f"{data} is truncated: {data.stat().st_size} bytes, its index corpus.idx needs "
        f"{data.stat().st_size + 2}"
    )


@pytest.mark.slow
def test_a_bad_line_fails_fast_with_its_number(tmp_path: Path, tokenizer_dir: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", corpus_texts(100), bad_line=3)
    command = ["data", "prepare", "-i", str(corpus), "-t", str(tokenizer_dir)]
    result = subprocess.run(
        [sys.executable, "-m", "primus.cli", *command, "-o", str(tmp_path / "out" / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PRIMUS_DEBUG"},
    )
    assert result.returncode == 2
    assert "error: " in result.stderr and "corpus.jsonl:3: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"body": "x"}', r"c.jsonl:2: no key 'text' \(keys: body\)"),
        ('{"text": 3}', r"c.jsonl:2: 'text' must be a string, got int"),
        ('["text"]', r"c.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_bad_records_name_their_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=message):
        list(read_documents(path, "text"))


def test_eod_choice(tmp_path: Path, tokenizer_dir: Path) -> None:
    tokenizer, directory = load_tokenizer(tokenizer_dir)
    assert find_eod(tokenizer, directory).token == "<doc_end>"
    assert find_eod(tokenizer, directory, "<unk>").id == tokenizer.token_to_id("<unk>")
    with pytest.raises(ConfigError, match="not in the tokenizer's vocabulary"):
        find_eod(tokenizer, directory, "<nope>")
    common = train_tokenizer(["<|endoftext|>"])
    assert find_eod(common, tmp_path).token == "<|endoftext|>"
    plain = train_tokenizer([])
    fresh = find_eod(plain, tmp_path)
    assert (fresh.id, fresh.token) == (plain.get_vocab_size(), None)  # past the vocabulary
    with pytest.raises(ConfigError, match=r"no tokenizer\.json in"):
        load_tokenizer(tmp_path)


@pytest.mark.slow
def test_training_on_prepared_data(tmp_path: Path, tokenizer_dir: Path) -> None:
    """Prepare a corpus, then train the tiny recipe on it with the overrides prepare printed."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", corpus_texts(600, seed=3))
    prefix = tmp_path / "data" / "corpus"
    prepared = subprocess.run(
        [sys.executable, "-m", "primus.cli", "data", "prepare", "-i", str(corpus),
         "-t", str(tokenizer_dir), "-o", str(prefix)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    line = next(x for x in prepared.stdout.splitlines() if x.startswith("or on the command line: "))
    overrides = shlex.split(line.removeprefix("or on the command line: "))
    recipe = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    trained = subprocess.run(
        [sys.executable, "-m", "primus.cli", "train", "pretrain", "--config", str(recipe),
         *overrides, "exp_name=on-data", "train_iters=15", "split=100,0,0"],  # a few dozen samples: all for training
        env={**os.environ, "PRIMUS_WORKSPACE": str(tmp_path / "ws")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = next((tmp_path / "ws").rglob("on-data"))
    report = json.loads((run_dir / "patch_report.json").read_text())
    mock = next(p for p in report["patches"] if p["id"] == "megatron.mock_data")
    assert mock["status"] == "skipped"  # it trained on the data, not on mock data
    assert "GPTDataset" in trained.stdout + trained.stderr
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1]["step"] == 15 and steps[-1]["loss"] < steps[0]["loss"] - 0.5
