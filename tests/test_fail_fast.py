"""Bad input fails in seconds: every check that needs no framework runs before one is imported
and before anything is written. Each case is a real `primus` process; it must exit 2 with the
key and file at fault, without a traceback, without having imported torch, JAX or a backend's
upstream, and without making the workspace. A run, a dry run and `config validate` agree."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from primus.core.errors import ConfigError
from primus.testing.runs import FAST_FORMS as FORMS
from primus.testing.runs import primus_imports, refused

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MEGATRON, TORCHTITAN, MAXTEXT = (
    CONFIGS / b / "tiny-cpu.yaml" for b in ("megatron", "torchtitan", "maxtext")
)


def megatron_corpus(prefix: Path, lengths: list[int], bin_bytes: int | None = None) -> str:
    """A corpus in Megatron's indexed layout (int32 tokens; the .bin `bin_bytes` long, by
    default as long as the index says); the prefix."""
    count = len(lengths)
    pointers = [4 * sum(lengths[:i]) for i in range(count)]
    index = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, count, count + 1)
    index += struct.pack(f"<{count}i", *lengths) + struct.pack(f"<{count}q", *pointers)
    index += struct.pack(f"<{count + 1}q", *range(count + 1))
    prefix.with_suffix(".idx").write_bytes(index)
    prefix.with_suffix(".bin").write_bytes(
        b"\1" * (4 * sum(lengths) if bin_bytes is None else bin_bytes)
    )
    return str(prefix)


@pytest.mark.parametrize("form", list(FORMS))
def test_a_missing_megatron_corpus_is_refused_at_its_key(tmp_path: Path, form: str) -> None:
    said = refused(tmp_path, form, MEGATRON, f"data_path=[{tmp_path / 'corpus'}]")
    assert f"data_path: the index file {tmp_path / 'corpus.idx'} does not exist" in said
    assert "cli (data_path=" in said and "hint: primus data prepare makes a corpus" in said


def empty(prefix: Path) -> None:
    prefix.with_suffix(".idx").touch()
    prefix.with_suffix(".bin").touch()


def junk_index(prefix: Path) -> None:
    prefix.with_suffix(".idx").write_bytes(b"junk" * 20)
    prefix.with_suffix(".bin").write_bytes(b"\1" * 48)


def index_cut(prefix: Path) -> None:
    megatron_corpus(prefix, [5, 7])
    index = prefix.with_suffix(".idx")
    index.write_bytes(index.read_bytes()[:50])


@pytest.mark.parametrize(
    ("corpus", "message"),
    [
        (empty, "the index file {d}/corpus.idx is empty"),
        (junk_index, "{d}/corpus.idx is not an index file of the indexed format (bad header)"),
        (
            lambda p: megatron_corpus(p, []),
            "{d}/corpus.idx indexes no documents: the corpus is empty",
        ),
        (
            lambda p: megatron_corpus(p, [5, 7], bin_bytes=40),
            "{d}/corpus.bin is truncated: 40 bytes, its index corpus.idx needs 48",
        ),
        (index_cut, "{d}/corpus.idx is truncated: 50 bytes, its header needs 82"),
    ],
    ids=["empty", "bad-header", "no-documents", "bin-truncated", "idx-truncated"],
)
def test_a_broken_megatron_corpus_is_refused(tmp_path: Path, corpus, message: str) -> None:
    corpus(tmp_path / "corpus")
    said = refused(tmp_path, "run", MEGATRON, f"data_path=[1.0, {tmp_path / 'corpus'}]")
    assert f"data_path: {message.format(d=tmp_path)}\n" in said


def test_a_megatron_corpus_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    prefix = megatron_corpus(tmp_path / "corpus", [5, 7])
    said = refused(tmp_path, "run", MEGATRON, f"data_path=[{prefix}]")
    assert "training on data needs a tokenizer, and tokenizer_type is not set" in said


def test_token_ids_beyond_the_vocabulary_of_a_corpus_without_a_manifest_are_refused(
    tmp_path: Path,
) -> None:
    """Without a manifest the .bin is read: its int32 tokens are 0x01010101 each, far beyond
    the model's 32 ids, which an embedding lookup would fail on at step 1."""
    prefix = megatron_corpus(tmp_path / "corpus", [5, 7])
    null = ["tokenizer_type=NullTokenizer", "vocab_size=32"]
    said = refused(tmp_path, "validate", MEGATRON, f"data_path=[{prefix}]", *null)
    assert (
        f"vocab_size: {prefix}.bin holds token id 16843009, outside the model's vocabulary "
        "of 32 (ids 0 to 31)"
    ) in said, said


def test_a_corpus_prepared_with_another_tokenizer_is_refused(
    cached_schemas: None, tmp_path: Path
) -> None:
    """Its manifest names the tokenizer and vocabulary that made it: named without a tokenizer
    it is valid (Megatron reads it with a NullTokenizer); a NullTokenizer too small for its
    token ids, or another HF tokenizer, is refused at the key that names it."""
    from primus.testing.corpus import prepared_reverse_task
    from primus.testing.sft_runs import REPO, SHIPPED

    prefix = prepared_reverse_task(tmp_path / "corpus" / "c", 50, 0, 10)  # vocabulary 61
    done, imported = primus_imports("config", "validate", str(MEGATRON), f"data_path=[{prefix}]")
    assert done.returncode == 0 and imported == [], done.stderr[-2000:]
    null = ["tokenizer_type=NullTokenizer", "vocab_size=32"]
    said = refused(tmp_path, "validate", MEGATRON, f"data_path=[{prefix}]", *null)
    assert f"vocab_size: {prefix} was tokenized with a vocabulary of 61" in said, said
    assert "vocab_size=61 null_tokenizer_eod_id=" in said  # the hint: the manifest's params
    other = tmp_path / "other"
    other.mkdir()
    for file in (REPO / SHIPPED / "tokenizer").iterdir():
        text = file.read_text()
        (other / file.name).write_text(text.replace('"apple"', '"apples"'))
    hf = ["tokenizer_type=HuggingFaceTokenizer", f"tokenizer_model={other}"]
    said = refused(tmp_path, "validate", MEGATRON, f"data_path=[{prefix}]", *hf)
    assert f"tokenizer_model: {prefix} was tokenized by " in said, said
    assert f"{other}/tokenizer.json is another tokenizer" in said


@pytest.mark.parametrize("form", list(FORMS))
def test_a_workspace_under_a_file_is_refused_before_the_framework_loads(
    tmp_path: Path, form: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    done, imported = primus_imports(
        *FORMS[form], str(MEGATRON), PRIMUS_WORKSPACE=str(blocker / "ws")
    )
    assert done.returncode == 2 and imported == [], done.stderr[-3000:]
    assert (
        "cannot hold the run directory" in done.stderr
        and f"{blocker} is not a folder" in done.stderr
    )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (None, "does not exist"),
        ('{"text": "one"}\n{"text": "two"', None),  # only the first record is read: fine
        ('{"id": 1}\n', "corpus.jsonl:1: a record needs a 'text' string"),
        ('\n{"text": "one",}\n', "corpus.jsonl:2: not valid JSON"),
        ("", "is empty"),
    ],
    ids=["missing", "good-first-record", "no-text", "bad-json", "empty"],
)
def test_a_bad_torchtitan_dataset_is_refused(
    tmp_path: Path, rows: str | None, message: str | None
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    if rows is not None:
        corpus.write_text(rows)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    args = ["mock_data=false", "dataloader.dataset=jsonl", f"dataloader.dataset_path={corpus}",
            f"hf_assets_path={tokenizer}"]  # fmt: skip
    said = refused(tmp_path, "validate", TORCHTITAN, *args)
    if message is None:  # the tokenizer folder is empty: the next check
        message = f"hf_assets_path: {tokenizer} holds no tokenizer"
    assert message in said


def test_missing_grain_files_are_refused(tmp_path: Path) -> None:
    pattern = tmp_path / "data" / "train-*.arrayrecord"
    said = refused(
        tmp_path, "dry-run", MAXTEXT, "dataset_type=grain", f"grain_train_files={pattern}"
    )
    assert f"grain_train_files: the grain data {pattern} does not exist" in said
    text = tmp_path / "data" / "train-0.arrayrecord"
    text.parent.mkdir()
    text.write_text('{"text": "a jsonl line, not an ArrayRecord file"}\n')
    said = refused(tmp_path, "validate", MAXTEXT, "dataset_type=grain", f"grain_train_files={text}")
    assert f"the grain data file {text} is not an ArrayRecord file" in said
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(text), "group_size:1")  # a real one passes
    writer.write(b'{"text": "one"}')
    writer.close()
    done, _ = primus_imports("config", "validate", str(MAXTEXT), "dataset_type=grain",
                             f"grain_train_files={text}", PRIMUS_WORKSPACE=str(tmp_path / "ws"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-3 HF model with its tokenizer."""
    from primus.testing.hf_models import make_hf_model
    from primus.testing.sft_data import write_tokenizer

    folder = make_hf_model(tmp_path_factory.mktemp("hf") / "llama3", "llama3")
    write_tokenizer(folder)
    return folder


@pytest.mark.parametrize(
    ("framework", "width"),
    [("megatron", "hidden_size: 64"), ("torchtitan", "dim: 64"), ("maxtext", "base_emb_dim: 64")],
)
def test_a_preset_is_derived_without_importing_a_framework(
    hf: Path, framework: str, width: str
) -> None:
    done, imported = primus_imports(
        "checkpoint", "preset", "--hf", str(hf), "--framework", framework
    )
    assert done.returncode == 0 and imported == [], done.stderr[-3000:]
    assert f"{width}\n" in done.stdout
    if framework == "megatron":  # --out where nothing can be written: one error, no traceback
        out = ("--out", str(hf / "config.json" / "preset.yaml"))
        refused, _ = primus_imports(
            "checkpoint", "preset", "--hf", str(hf), "--framework", framework, *out
        )
        assert refused.returncode == 2 and "config.json is not a folder" in refused.stderr
        config = (hf / "config.json").read_bytes()  # --out onto the model's own config.json
        onto, _ = primus_imports("checkpoint", "preset", "--hf", str(hf), "--framework",
                                 framework, "--out", str(hf / "config.json"))  # fmt: skip
        assert onto.returncode == 2 and "it is a file of the HF model" in onto.stderr
        assert (hf / "config.json").read_bytes() == config


def test_a_bad_line_of_sft_data_is_refused_before_the_hf_import(tmp_path: Path, hf: Path) -> None:
    """Line 7 of the training chats is not JSON: exit 2 at bad.jsonl:7, before the HF model is
    imported into the run directory (which is not made)."""
    from primus.testing.sft_runs import sft_experiment

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"}]}
    lines = [json.dumps(chat)] * 9
    lines[6] = lines[6][:-3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(chat) + "\n")
    task = {"hf": hf, "chat_train": bad, "chat_eval": good}
    exp = sft_experiment(CONFIGS / "megatron" / "sft-tiny-cpu.yaml", tmp_path / "exp", task)
    done, imported = primus_imports("train", "posttrain", "--config", str(exp))
    assert done.returncode == 2 and imported == [], done.stderr[-3000:]
    assert f"{bad}:7: not valid JSON" in done.stderr
    assert not (tmp_path / "exp" / "ws").exists()


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        (
            MEGATRON,
            [
                "data_path=[0.5, s3://bucket/a, 0.5, msc://profile/b]",
                "tokenizer_type=NullTokenizer",
            ],
        ),
        (
            TORCHTITAN,
            [
                "mock_data=false",
                "dataloader.dataset=jsonl",
                "hf_assets_path={tokenizer}",
                "dataloader.dataset_path=hf://datasets/team/corpus/train.jsonl",
            ],
        ),
        (MAXTEXT, ["dataset_type=grain", "grain_train_files=gs://bucket/train-*.arrayrecord"]),
    ],
    ids=["megatron", "torchtitan", "maxtext"],
)
def test_remote_data_is_left_to_the_backend(
    tmp_path: Path, config: Path, overrides: list[str]
) -> None:
    """URLs (object storage, the HF hub, GCS) are read by the backend: the fast checks pass them
    (TorchTitan's tokenizer folder is still checked)."""
    from primus.core.runtime import resolution

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    given = [override.format(tokenizer=tokenizer) for override in overrides]
    module = next(iter(resolution.load(config, given).modules.values()))
    adapter = resolution.adapter_class(module.framework)(module.framework)
    adapter.check_inputs(module)
    if config == TORCHTITAN:
        (tokenizer / "tokenizer.json").unlink()
        with pytest.raises(ConfigError, match=r"hf_assets_path: .* holds no tokenizer"):
            adapter.check_inputs(module)


REFUSED_FROM_THE_PARAMS = {
    MEGATRON: ("lr_warmup_init=1.0", "lr_warmup_init 1.0 is above lr"),
    TORCHTITAN: ("model.n_kv_heads=3", "model.n_kv_heads (3) must divide model.n_heads"),
    MAXTEXT: ("steps=0", "steps must be a positive number, or -1"),
}


@pytest.mark.parametrize("config", [MEGATRON, TORCHTITAN, MAXTEXT], ids=lambda p: p.parent.name)
def test_validate_imports_no_framework_once_the_schema_is_cached(
    cached_schemas: None, config: Path
) -> None:
    """`config validate` reads the schema from the cache and the backend's own value checks
    need no framework; `--full` imports it."""
    framework = config.parent.name
    done, imported = primus_imports("config", "validate", str(config))
    assert done.returncode == 0 and imported == [], done.stderr[-3000:]
    override, message = REFUSED_FROM_THE_PARAMS[config]
    done, imported = primus_imports("config", "validate", str(config), override)
    assert done.returncode == 2 and imported == [] and message in done.stderr, done.stderr
    if framework == "megatron":
        done, imported = primus_imports("config", "validate", "--full", str(config))
        assert done.returncode == 0 and "megatron" in imported, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("config", "saves"),
    [(MEGATRON, "save_interval=1"), (TORCHTITAN, "checkpoint.enable=true"),
     (MAXTEXT, "enable_checkpointing=true")],
    ids=lambda v: v.parent.name if isinstance(v, Path) else "",
)  # fmt: skip
def test_a_workspace_without_room_for_one_checkpoint_is_refused(
    cached_schemas: None, tmp_path: Path, config: Path, saves: str
) -> None:
    """A 1 MiB file system for a run whose checkpoint (weights and optimizer state of the tiny
    models, about 1.5-2.5 MiB) cannot fit; without checkpoints the same workspace is fine."""
    from primus.testing.disk import small_disk

    with small_disk(tmp_path / "disk", "1m") as disk:
        for form in ("run", "validate"):
            done, imported = primus_imports(
                *FORMS[form], str(config), saves, PRIMUS_WORKSPACE=str(disk)
            )
            assert done.returncode == 2 and imported == [], done.stderr[-3000:]
            assert re.search(rf"the workspace's file system \({disk}\) has [\d.]+ MiB free, and "
                             r"one checkpoint of this run takes about [\d.]+ MiB", done.stderr)  # fmt: skip
            assert list(disk.iterdir()) == []
        done, imported = primus_imports(
            "config", "validate", str(config), PRIMUS_WORKSPACE=str(disk)
        )
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("form", ["run", "dry-run"])
def test_the_posttrain_stage_without_sft_data_is_refused(
    cached_schemas: None, tmp_path: Path, form: str
) -> None:
    stage = ("train", "posttrain", *FORMS[form][2:])
    done, imported = primus_imports(*stage, str(MEGATRON), PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    assert done.returncode == 2 and imported == [], done.stderr[-3000:]
    assert "the posttrain stage needs the module's sft: section (the data)" in done.stderr
    assert "module 'pre_trainer' has none" in done.stderr
    assert not (tmp_path / "ws").exists()
