"""`primus data prepare`: a local tokenizer and a tiny corpus cut into many chunks; in process,
except for the kill of a real run and one CLI run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pq = pytest.importorskip("pyarrow.parquet")
import pyarrow as pa  # type: ignore[import-untyped]  # noqa: E402

from primus.cli.main import main  # noqa: E402
from primus.core.data.indexed import IndexedCorpus  # noqa: E402
from primus.core.data.manifest import read_manifest, sha256  # noqa: E402
from primus.core.data.prepare import Request, prepare  # noqa: E402
from primus.core.data.tokenizer import find_eod, load_tokenizer  # noqa: E402
from primus.core.errors import ConfigError  # noqa: E402
from primus.testing.corpus import (  # noqa: E402
    corpus_texts,
    expected_documents,
    tokenizer_dir,
    train_tokenizer,
    write_jsonl,
)

CHUNK = 2048  # bytes: a few dozen documents, so that the tiny corpus makes many chunks


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def eod(tokenizer: Path) -> int:
    loaded, directory = load_tokenizer(tokenizer)
    return find_eod(loaded, directory).id


def run(inputs: list[Path], tokenizer: Path, prefix: Path, **options: object) -> object:
    request = Request([str(p) for p in inputs], tokenizer, prefix, chunk_bytes=CHUNK, **options)  # type: ignore[arg-type]
    return prepare(request)


def files(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def test_an_empty_text_is_skipped_though_the_tokenizer_adds_a_bos_token(tmp_path: Path) -> None:
    """The shipped SFT tokenizer adds BOS: an empty text would be [BOS, EOD] were it kept."""
    shipped = Path(__file__).parents[3] / "configs" / "data" / "sft-tiny" / "tokenizer"
    loaded, _ = load_tokenizer(shipped)
    assert loaded.encode("").ids  # BOS
    corpus = write_jsonl(tmp_path / "c.jsonl", ["", "hi there", ""])
    run([corpus], shipped, tmp_path / "out" / "c")
    manifest = read_manifest(tmp_path / "out" / "c")
    assert manifest is not None
    assert (manifest["documents"], manifest["empty_documents_skipped"]) == (1, 2)
    assert len(IndexedCorpus(tmp_path / "out" / "c")) == 1


def test_one_and_two_workers_write_the_same_corpus(
    tmp_path: Path, tokenizer: Path, eod: int
) -> None:
    texts = corpus_texts(400)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)
    run([corpus], tokenizer, tmp_path / "one" / "c", workers=1)
    run([corpus], tokenizer, tmp_path / "two" / "c", workers=2)
    assert files(tmp_path / "one" / "c") == files(tmp_path / "two" / "c")
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["c.bin", "c.idx", "c.json"]

    expected = expected_documents(tokenizer, texts, eod)
    corpus_read = IndexedCorpus(tmp_path / "two" / "c")
    assert [corpus_read[i].tolist() for i in range(len(corpus_read))] == expected
    assert corpus_read.document_indices.tolist() == list(range(len(expected) + 1))
    assert corpus_read.dtype.name == "uint16"

    manifest = read_manifest(tmp_path / "two" / "c")
    assert manifest is not None
    tokens = sum(map(len, expected))
    assert (manifest["documents"], manifest["empty_documents_skipped"]) == (len(expected), 2)
    assert (manifest["tokens"], manifest["dtype"], manifest["vocab_size"]) == (tokens, "uint16", 300)  # fmt: skip
    assert manifest["eod"] == {
        "id": eod, "token": "<doc_end>", "source": "eos_token in tokenizer_config.json"
    }  # fmt: skip
    assert manifest["tokenizer"]["sha256"] == sha256(tokenizer / "tokenizer.json")
    assert manifest["sources"] == [{
        "path": str(corpus.resolve()), "format": "jsonl", "bytes": corpus.stat().st_size,
        "sha256": sha256(corpus),
    }]  # fmt: skip
    assert manifest["primus_version"] and manifest["created"].startswith("20")
    assert (manifest["bin"], manifest["idx"], manifest["key"]) == ("c.bin", "c.idx", "text")


def dies(chunk: object) -> object:
    os._exit(9)  # a worker killed, as the kernel's out-of-memory killer would


def test_a_worker_that_dies_is_an_error_that_keeps_the_work_done(
    tmp_path: Path, tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from primus.core.data import prepare as module
    from primus.core.errors import PrimusError

    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_texts(100))
    monkeypatch.setattr(module, "tokenize", dies)
    with pytest.raises(PrimusError, match="a tokenizing worker died") as died:
        run([corpus], tokenizer, tmp_path / "c", workers=2)
    assert "run the same command again to continue" in str(died.value)
    assert Path(f"{tmp_path / 'c'}.journal").exists()


def test_partial_output_of_another_command_is_started_over(
    tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_texts(100))
    prefix = tmp_path / "c"
    Path(f"{prefix}.journal").write_text('{"fingerprint": "other"}\n{"chunk": 0, "bin": 3}\n')
    Path(f"{prefix}.bin.partial").write_bytes(b"old")
    args = ["data", "prepare", "-i", str(corpus), "-t", str(tokenizer), "-o", str(prefix)]
    with pytest.raises(SystemExit):
        main([*args, "--chunk-size", "1K", "--workers", "1"])
    assert "starting over: partial output of another command" in capsys.readouterr().err
    run([corpus], tokenizer, tmp_path / "clean")
    assert files(prefix) == files(tmp_path / "clean")

    with pytest.raises(SystemExit):
        main(["data", "inspect", str(prefix), "--show", "1"])
    said = capsys.readouterr().out
    assert said.startswith("98 documents, ") and "\n  0: [" in said and '"documents": 98' in said
    Path(f"{prefix}.json").write_text("{garbage")  # a damaged manifest is said to be one
    with pytest.raises(SystemExit):
        main(["data", "inspect", str(prefix)])
    said = capsys.readouterr().out
    assert f"manifest: {prefix}.json is not a manifest of this format" in said


def test_one_run_at_a_time_on_a_prefix(tmp_path: Path, tokenizer: Path) -> None:
    import fcntl

    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_texts(20))
    with Path(f"{tmp_path / 'c'}.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another run's
        with pytest.raises(ConfigError, match="is being prepared by another command"):
            run([corpus], tokenizer, tmp_path / "c")
    run([corpus], tokenizer, tmp_path / "c")  # the other run is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.bin", "c.idx", "c.json", "corpus.jsonl"]  # fmt: skip


def test_the_progress_line() -> None:
    from primus.cli.data_cmd import CorpusProgress
    from primus.core.data.journal import Counts
    from primus.core.data.prepare import Plan

    out = io.StringIO()
    progress = CorpusProgress(
        Plan(None, 300, "uint16", 2, 4, 1, 4_000_000, Counts(bytes=1_000_000)), out
    )
    progress.start -= 2.0  # two seconds in, 1 MB read
    progress.update(Counts(1234, 0, 56789, 2_000_000))
    progress.finish()
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("1,234 docs · 56,789 tokens · 0.5 MB/s · 50% · ETA 0:00:0")


def test_parquet_txt_and_globs_in_order(tmp_path: Path, tokenizer: Path, eod: int) -> None:
    texts = corpus_texts(90, seed=2)
    table = pa.table({"id": list(range(30)), "body": texts[:30]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=12)  # three row groups
    for i, text in enumerate(texts[30:40]):  # one document per file, whatever its lines
        (tmp_path / f"t{i}.txt").write_text(text + "\nsecond line", encoding="utf-8")
    (tmp_path / "t0.txt").write_text(texts[30] + "\nsecond line", encoding="utf-8-sig")  # a BOM
    write_jsonl(tmp_path / "b.jsonl", texts[40:], key="body")
    inputs = [tmp_path / "a.parquet", tmp_path / "t?.txt", tmp_path / "b.jsonl"]
    run(inputs, tokenizer, tmp_path / "out" / "c", key="body")

    txt = [t + "\nsecond line" for t in texts[30:40]]
    expected = expected_documents(tokenizer, [*texts[:30], *txt, *texts[40:]], eod)
    read = IndexedCorpus(tmp_path / "out" / "c")
    assert [read[i].tolist() for i in range(len(read))] == expected
    manifest = read_manifest(tmp_path / "out" / "c")
    assert manifest is not None
    assert [s["format"] for s in manifest["sources"]] == ["parquet", *["txt"] * 10, "jsonl"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "no closing quote}', r"c.jsonl:200: not valid JSON: Unterminated string"),
        ('{"body": "x"}', r"c.jsonl:200: no key 'text' \(keys: body\)"),
        ('{"text": null}', r"c.jsonl:200: 'text' must be a string, got null"),
        ('["text"]', r"c.jsonl:200: expected a JSON object, got array"),
        ('{"text": "\\ud800 alone"}', r"c.jsonl:200: 'text' holds an unpaired UTF-16 surrogate"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(
    tmp_path: Path, tokenizer: Path, line: str, message: str
) -> None:
    lines = [json.dumps({"text": t}) for t in corpus_texts(300)]
    lines[199] = line  # line 200, several chunks in
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=message):
        run([corpus], tokenizer, tmp_path / "out" / "c", workers=2)
    assert list((tmp_path / "out").iterdir()) == []  # no partial output left


def test_bad_parquet_and_txt(tmp_path: Path, tokenizer: Path) -> None:
    pq.write_table(pa.table({"text": ["a", "b", None]}), tmp_path / "n.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "i.parquet")
    (tmp_path / "x.txt").write_bytes(b"ok \xff")
    cases = [
        ("n.parquet", r"n.parquet: row 3: 'text' is null"),
        ("i.parquet", r"i.parquet: column 'text' holds int64, not strings"),
        ("x.txt", r"x.txt: not UTF-8 text: byte 3"),
        ("none*.jsonl", r"no file matches .*none\*.jsonl"),
    ]
    for name, message in cases:
        with pytest.raises(ConfigError, match=message):
            run([tmp_path / name], tokenizer, tmp_path / "out" / "c")
    with pytest.raises(ConfigError, match=r"no column 'body' \(columns: text\)"):
        run([tmp_path / "n.parquet"], tokenizer, tmp_path / "out" / "c", key="body")


def test_eod_choice(tmp_path: Path, tokenizer: Path) -> None:
    loaded, directory = load_tokenizer(tokenizer)
    assert find_eod(loaded, directory).token == "<doc_end>"
    assert find_eod(loaded, directory, "<unk>").id == loaded.token_to_id("<unk>")
    with pytest.raises(ConfigError, match="'<nope>' is not in the vocabulary of the tokenizer in"):
        find_eod(loaded, directory, "<nope>")
    common = train_tokenizer(["<|endoftext|>"])
    assert find_eod(common, tmp_path).token == "<|endoftext|>"
    (tmp_path / "bad").mkdir()  # an eos_token that names no token is refused, not replaced
    for eos, said in (('"<nope>"', f"eos_token '<nope>' is not in the vocabulary of the tokenizer in "
                       f"{tmp_path / 'bad'}"), ('{"content": 5}', "content must be a string, got number")):  # fmt: skip
        (tmp_path / "bad" / "tokenizer_config.json").write_text(f'{{"eos_token": {eos}}}')
        with pytest.raises(ConfigError, match=re.escape(said)):
            find_eod(common, tmp_path / "bad")
    plain = train_tokenizer([])
    fresh = find_eod(plain, tmp_path)
    assert (fresh.id, fresh.token) == (plain.get_vocab_size(), None)  # past the vocabulary
    with pytest.raises(ConfigError, match=r"no tokenizer\.json in"):
        load_tokenizer(tmp_path)


def test_files_named_as_arguments_come_before_those_of_input(
    tmp_path: Path, tokenizer: Path, eod: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`primus data prepare a.jsonl b.jsonl -i c.jsonl`, as a shell's glob gives them; none at
    all is a usage error."""
    texts = corpus_texts(30, seed=3)
    corpora = [write_jsonl(tmp_path / f"{name}.jsonl", texts[i * 10 : i * 10 + 10])
               for i, name in enumerate("abc")]  # fmt: skip
    prefix, options = tmp_path / "out" / "c", ["-t", str(tokenizer), "--workers", "1"]
    with pytest.raises(SystemExit) as done:
        main(["data", "prepare", str(corpora[0]), str(corpora[1]), "-i", str(corpora[2]),
              "-o", str(prefix), *options])  # fmt: skip
    assert done.value.code == 0
    read = IndexedCorpus(prefix)
    assert [read[i].tolist() for i in range(len(read))] == expected_documents(tokenizer, texts, eod)
    said = refused(capsys, "-o", str(tmp_path / "none"), *options)
    assert "name the files to tokenize (FILE... or --input FILE)" in said


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`primus data prepare ARGS` in process: exit 2; its error, click's box unwrapped."""
    with pytest.raises(SystemExit) as done:
        main(["data", "prepare", *args])
    assert done.value.code == 2
    return " ".join(re.sub("[│╭╮╰╯─]", " ", capsys.readouterr().err).split())


def test_outputs_and_options_it_cannot_honour_are_refused(
    tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o data` (a folder) wrote data.bin in its parent; --no-append-eod ignored --eod-token."""
    corpus = write_jsonl(tmp_path / "a.jsonl", corpus_texts(5))
    (tmp_path / "data").mkdir()
    given = [str(corpus), "-t", str(tokenizer)]
    for output in (tmp_path / "data", f"{tmp_path}/new/"):
        said = refused(capsys, *given, "-o", str(output))
        assert "is a folder; the output is a prefix in one" in said
    said = refused(capsys, *given, "-o", ".bin")  # the folder it runs in, as the prefix
    assert "Invalid value for --output: '.bin' names no prefix" in said
    assert "-o is empty" in refused(capsys, *given, "-o", "")
    said = refused(capsys, *given, "-o", str(tmp_path / "c"), "--no-append-eod", "--eod-token", "x")
    assert "Invalid value for --eod-token: --no-append-eod writes no end-of-document id" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "data"]
    with pytest.raises(ConfigError, match=r"cannot write the corpus .*a.jsonl/c: \S*a.jsonl is"):
        run([corpus], tokenizer, corpus / "c")  # under a file


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["data", "prepare", "--help"])
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", capsys.readouterr().out).split())
    for option in ("--input", "--tokenizer", "--output", "--key", "--append-eod", "--eod-token",
                   "--workers", "--chunk-size", "--overwrite", "one document per file", "PREFIX.json"):  # fmt: skip
        assert option in said


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "primus.cli", *args], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip


def test_the_command_fails_on_a_bad_line_in_one_line(tmp_path: Path, tokenizer: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": 3}\n')
    result = cli(
        "data", "prepare", "-i", str(corpus), "-t", str(tokenizer), "-o", str(tmp_path / "o" / "c")
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith("c.jsonl:2: 'text' must be a string, got number")
    assert "Traceback" not in result.stderr


# The command in a process of its own, its chunks from the seventh on held back a minute (in
# its forked workers too), so that a stop after four chunks lands mid-run however loaded the
# machine is; Ctrl-C's handler as in a terminal, even where the suite runs with SIGINT ignored
# (a background job), which its processes would inherit.
SLOW = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import sys, time; from primus.core.data import sources; texts = sources.texts; "
    f"sources.texts = lambda c, k: (time.sleep(0.05 if c.start < 6 * {CHUNK} else 60), "
    "texts(c, k))[1]; from primus.cli.main import main; main(sys.argv[1:])"
)


def processes_naming(text: str) -> list[int]:
    """The processes whose command line holds `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_killed_run_continues_to_the_same_corpus(
    tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str], stop: signal.Signals
) -> None:
    """SIGKILL to the command alone, or Ctrl-C's SIGINT to its process group (which says so
    and exits 130), after 4 chunks: the same command continues to the bytes of a clean run."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_texts(600))
    prefix = tmp_path / "out" / "c"
    args = ["data", "prepare", "-i", str(corpus), "-t", str(tokenizer), "-o", str(prefix),
            "--chunk-size", str(CHUNK), "--workers", "2"]  # fmt: skip
    journal = Path(f"{prefix}.journal")
    process = subprocess.Popen([sys.executable, "-c", SLOW, *args], stderr=subprocess.PIPE,
                               text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) > 4:  # 4 chunks done
            process.send_signal(stop) if stop == signal.SIGKILL else os.killpg(process.pid, stop)
            break
        time.sleep(0.01)
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode == (-stop if stop == signal.SIGKILL else 130), stderr[-2000:]
    if stop == signal.SIGINT:
        assert "Traceback" not in stderr
        assert "interrupted: the chunks done are kept; run the same command again" in stderr
    while processes_naming(str(prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)  # its workers die with it
    assert processes_naming(str(prefix)) == []
    assert not Path(f"{prefix}.bin").exists()  # nothing final before the end
    with Path(f"{prefix}.bin.partial").open("ab") as torn:  # a chunk written, not journaled
        torn.write(b"\1\2\3")
    with journal.open("a") as torn:  # and its journal line cut short
        torn.write('{"chunk": 99, "bin"')

    with pytest.raises(SystemExit) as exited:
        main(args)  # the same command
    assert exited.value.code in (0, None)
    said = capsys.readouterr()
    continued = re.search(r"continuing: (\d+) of (\d+) chunks", said.err)
    assert continued, said.err
    done, chunks = map(int, continued.groups())
    assert 4 <= done < chunks and f"; {done} chunks by the run before" in said.out
    run([corpus], tokenizer, tmp_path / "clean" / "c", workers=1)  # one worker, never killed
    assert files(prefix) == files(tmp_path / "clean" / "c")
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["c.bin", "c.idx", "c.json"]
