"""Tokenize a JSONL corpus into Megatron's indexed dataset (PREFIX.bin + PREFIX.idx).

Like Megatron's tools/preprocess_data.py with a Hugging Face `tokenizers` tokenizer: one
document per line, the tokenizer's own special tokens, an end-of-document token appended,
uint16 ids when the vocabulary allows. Writes through megatron-core's IndexedDatasetBuilder.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from primus.core.errors import ConfigError, Origin, PrimusError

# End-of-text tokens of common tokenizer families, tried when the tokenizer names none.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
BATCH = 1024


@dataclass(frozen=True)
class Eod:
    """The end-of-document id, its token (None for an id past the vocabulary) and why."""

    id: int
    token: str | None
    source: str


@dataclass(frozen=True)
class Prepared:
    """What `prepare` wrote."""

    documents: int
    empty: int
    tokens: int
    vocab_size: int  # what training needs: covers every id, the EOD included
    eod: Eod | None
    dtype: str
    bin_path: Path
    idx_path: Path
    seconds: float


def load_tokenizer(path: Path) -> tuple[Tokenizer, Path]:
    """A tokenizer from a tokenizer.json file or a directory holding one, and its directory."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"no tokenizer.json in {path}" if path.is_dir() else f"tokenizer not found: {path}",
            hint="pass a Hugging Face tokenizer directory or its tokenizer.json file",
        )
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:
        raise ConfigError(f"cannot load tokenizer {file}: {exc}") from exc
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, file.parent


def vocab_size_of(tokenizer: Tokenizer) -> int:
    """One past the largest id the tokenizer can produce (added tokens included)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max(
        tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1
    )


def _configured_eos(directory: Path) -> str | None:
    config = directory / "tokenizer_config.json"
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return eos.get("content") if isinstance(eos, dict) else eos if isinstance(eos, str) else None


def find_eod(tokenizer: Tokenizer, directory: Path, token: str | None = None) -> Eod:
    """The EOD id: `token` if given, else tokenizer_config.json's eos_token, else a common
    end-of-text token, else a new id one past the vocabulary (never a real token's id)."""
    if token is not None:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ConfigError(f"--eod-token {token!r} is not in the tokenizer's vocabulary")
        return Eod(token_id, token, "--eod-token")
    eos = _configured_eos(directory)
    eos_id = None if eos is None else tokenizer.token_to_id(eos)
    if eos is not None and eos_id is not None:
        return Eod(eos_id, eos, "eos_token in tokenizer_config.json")
    for candidate in EOD_CANDIDATES:
        token_id = tokenizer.token_to_id(candidate)
        if token_id is not None:
            return Eod(token_id, candidate, "the tokenizer's end-of-text token")
    size = vocab_size_of(tokenizer)
    return Eod(size, None, "the tokenizer has no end-of-text token: a new id past its vocabulary")


def read_documents(path: Path, key: str) -> Iterator[tuple[str | None, int]]:
    """(text, bytes read) per line of a JSONL file, text None for a blank line.

    A bad line is a ConfigError that names the file and line."""
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                yield None, len(line)
                continue
            where = Origin("file", file=str(path), line=lineno)
            try:
                record = json.loads(line)
            except ValueError as exc:
                reason = str(exc)
                if isinstance(exc, json.JSONDecodeError):
                    reason = f"{exc.msg}: column {exc.colno}"
                raise ConfigError(f"not valid JSON: {reason}", origin=where) from None
            if not isinstance(record, dict):
                raise ConfigError(f"expected a JSON object, got {type(record).__name__}", where)
            if key not in record:
                keys = ", ".join(sorted(record)) or "none"
                raise ConfigError(
                    f"no key '{key}' (keys: {keys})", where, hint="choose one with --json-key"
                )
            text = record[key]
            if not isinstance(text, str):
                raise ConfigError(f"'{key}' must be a string, got {type(text).__name__}", where)
            yield text, len(line)


def _batches(docs: Iterator[tuple[str | None, int]]) -> Iterator[tuple[list[str], int]]:
    texts: list[str] = []
    size = 0
    for text, nbytes in docs:
        size += nbytes
        if text is not None:
            texts.append(text)
        if len(texts) == BATCH:
            yield texts, size
            texts, size = [], 0
    if texts or size:
        yield texts, size


def _import_builder() -> tuple[Any, Any]:
    import logging
    import warnings

    from primus.backends.megatron.config.bridge import silence_import_notices

    silence_import_notices()
    warnings.filterwarnings("ignore", category=SyntaxWarning)  # megatron-core's, at compile time
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    return DType, IndexedDatasetBuilder


def _write(
    builder: Any,
    batches: Iterable[tuple[list[str], int]],
    tokenizer: Tokenizer,
    eod: Eod | None,
    on_batch: Callable[[int, int, int], None] | None,
) -> tuple[int, int, int]:
    """Tokenize each batch into the builder: (documents, empty documents, tokens)."""
    documents = empty = tokens = 0
    for texts, nbytes in batches:
        batch_tokens = 0
        for encoding in tokenizer.encode_batch(texts) if texts else []:
            ids = encoding.ids
            if not ids:  # Megatron skips empty documents too (and adds no EOD)
                empty += 1
                continue
            if eod is not None:
                ids = [*ids, eod.id]
            builder.add_document(ids, [len(ids)])
            batch_tokens += len(ids)
        documents += len(texts)
        tokens += batch_tokens
        if on_batch:
            on_batch(len(texts), batch_tokens, nbytes)
    return documents - empty, empty, tokens


def prepare(
    input_path: Path,
    tokenizer_path: Path,
    prefix: Path,
    json_key: str = "text",
    append_eod: bool = True,
    eod_token: str | None = None,
    workers: int | None = None,
    on_start: Callable[[Eod | None, int], None] | None = None,
    on_batch: Callable[[int, int, int], None] | None = None,
) -> Prepared:
    """Write PREFIX.bin and PREFIX.idx (to temporary names, renamed at the end).

    Bad input fails before megatron-core is imported where it can: the tokenizer, and the
    first lines of the corpus. `on_start(eod, vocab_size)` is called before tokenizing,
    `on_batch(documents, tokens, bytes)` after each batch. `workers` caps the tokenizer's
    threads (default: all cores).
    """
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    tokenizer, directory = load_tokenizer(tokenizer_path)
    eod = find_eod(tokenizer, directory, eod_token) if append_eod else None
    vocab = max(vocab_size_of(tokenizer), eod.id + 1 if eod else 0)
    batches = _batches(read_documents(input_path, json_key))
    first = next(batches, ([], 0))
    dtype_cls, builder_cls = _import_builder()
    dtype = dtype_cls.optimal_dtype(vocab)
    if workers is not None:  # the tokenizer's thread pool reads it when it first starts
        os.environ["RAYON_NUM_THREADS"] = str(workers)
    if on_start:
        on_start(eod, vocab)

    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    tmp_bin, tmp_idx = (Path(f"{p}.{os.getpid()}.tmp") for p in (bin_path, idx_path))
    start, builder = time.monotonic(), None
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        builder = builder_cls(str(tmp_bin), dtype=dtype)
        counts = _write(builder, itertools.chain([first], batches), tokenizer, eod, on_batch)
        builder.finalize(str(tmp_idx))
        idx_path.unlink(missing_ok=True)  # never pair an old .idx with the new .bin
        os.replace(tmp_bin, bin_path)
        os.replace(tmp_idx, idx_path)
    except OSError as exc:
        raise PrimusError(f"cannot write {prefix}.bin/.idx: {exc}") from exc
    finally:
        if builder is not None:
            builder.data_file.close()
        for tmp in (tmp_bin, tmp_idx):
            tmp.unlink(missing_ok=True)
    documents, empty, tokens = counts
    seconds = time.monotonic() - start
    return Prepared(
        documents, empty, tokens, vocab, eod, dtype.__name__, bin_path, idx_path, seconds
    )
