"""Tokenize text into a corpus of the indexed format, in parallel, in bounded memory, resumably.

The input is cut into chunks (`sources.plan`: by the files and the chunk size alone). Worker
processes tokenize chunks; the results are appended in chunk order to PREFIX.bin.partial (the
tokens) and PREFIX.sizes.partial (the tokens per document), each followed by a line in
PREFIX.journal. At most two chunks per worker are in flight, so memory does not grow with the
corpus, and the bytes do not depend on the number of workers. A run that is killed is continued
by the same command: the journal names the chunks done and where the files ended after the
last one. At the end PREFIX.idx is written from the sizes, then PREFIX.bin, PREFIX.idx and the
manifest PREFIX.json are renamed into place (the old .idx is removed first: never an old index
with new tokens). A corpus already at the prefix is kept, and nothing done, when its manifest
says the same inputs and settings made it; another one is replaced only with `overwrite`.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.core.data import indexed, manifest, sources
from primus.core.data.journal import Counts, Output
from primus.core.data.tokenizer import (
    INSTALL,
    Eod,
    find_eod,
    load_tokenizer,
    tokenizer_file,
    vocab_size_of,
)
from primus.core.errors import ConfigError, PrimusError
from primus.core.folders import unwritable
from primus.core.launch.reaper import die_with_parent

CHUNK_BYTES = 4 << 20
BATCH = 1024  # documents per call of the tokenizer


@dataclass(frozen=True)
class Request:
    """What to prepare: the options of `primus data prepare`."""

    inputs: list[str]
    tokenizer: Path
    prefix: Path
    key: str = "text"
    append_eod: bool = True
    eod_token: str | None = None
    workers: int | None = None  # default: the cores this process may use
    chunk_bytes: int = CHUNK_BYTES
    command: str = ""
    overwrite: bool = False  # replace a corpus made otherwise at the prefix


@dataclass(frozen=True)
class Plan:
    """What a run is about to do, for the caller to show."""

    eod: Eod | None
    vocab_size: int
    dtype: str
    workers: int
    chunks: int
    done: int  # chunks a killed run finished before
    total_bytes: int
    done_counts: Counts
    note: str | None = None  # why partial output was not continued


@dataclass(frozen=True)
class Prepared:
    """What a run wrote."""

    counts: Counts
    vocab_size: int
    eod: Eod | None
    dtype: str
    prefix: Path
    seconds: float
    resumed: int  # chunks done by an earlier, killed run
    files: list[Path] = field(default_factory=list)  # .bin, .idx, .json
    already: bool = False  # the corpus was there, made from the same inputs and settings


@dataclass(frozen=True)
class Tokenized:
    """A chunk's tokens and document sizes, as the files hold them."""

    tokens: bytes
    sizes: bytes
    counts: Counts


_WORKER: dict[str, Any] = {}


def _start_worker(
    tokenizer: str, eod: int | None, dtype: str, key: str, parent: int | None
) -> None:
    """Load the tokenizer: in this process (`parent` None), or in a worker process of `parent`,
    which dies with it (a killed command leaves no workers behind)."""
    if parent is not None:
        if die_with_parent(signal.SIGKILL) and os.getppid() != parent:
            os._exit(1)  # the command died before the death signal was set
        os.environ["RAYON_NUM_THREADS"] = "1"  # one thread each: the processes are the parallel
    loaded, _ = load_tokenizer(Path(tokenizer))
    encode = getattr(loaded, "encode_batch_fast", loaded.encode_batch)
    _WORKER.update(encode=encode, eod=eod, dtype=dtype, key=key)


def tokenize(chunk: sources.Chunk) -> Tokenized:
    """Tokenize one chunk (in a worker); empty documents, and those that tokenize to nothing,
    are skipped (a tokenizer that adds a BOS token would make an empty text one token)."""
    import numpy as np

    encode, eod = _WORKER["encode"], _WORKER["eod"]
    ids: list[int] = []
    sizes: list[int] = []
    documents = 0
    for batch in itertools.batched(sources.texts(chunk, _WORKER["key"]), BATCH):
        documents += len(batch)
        for encoding in encode([text for text in batch if text]):
            if encoding.ids:
                ids += encoding.ids
                if eod is not None:
                    ids.append(eod)
                sizes.append(len(encoding.ids) + (eod is not None))
    counts = Counts(len(sizes), documents - len(sizes), len(ids), chunk.weight)
    tokens = np.array(ids, dtype=_WORKER["dtype"]).tobytes()
    return Tokenized(tokens, np.array(sizes, dtype=np.int32).tobytes(), counts)


def _in_order(
    pool: ProcessPoolExecutor,
    chunks: Iterable[sources.Chunk],
    window: int,
    started: Callable[[], None],
) -> Iterator[Tokenized]:
    """The pool's results in chunk order, at most `window` chunks in flight; `started` is
    called once the first is submitted (the workers then exist)."""
    pending: deque[Future[Tokenized]] = deque()
    for chunk in chunks:
        pending.append(pool.submit(tokenize, chunk))
        if len(pending) == 1:
            started()
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _append(
    out: Output,
    results: Iterable[Tokenized],
    done: int,
    counts: Counts,
    on_chunk: Callable[[Counts], None] | None,
) -> None:
    """Append each result to the partial files and journal it."""
    with (
        out.partial_bin.open("ab") as tokens,
        out.partial_sizes.open("ab") as sizes,
        out.journal.open("a") as journal,
    ):
        for chunk, result in enumerate(results, start=done):
            tokens.write(result.tokens)
            sizes.write(result.sizes)
            tokens.flush()
            sizes.flush()  # the data is in the files before the journal says so
            for name in ("documents", "empty", "tokens", "bytes"):
                setattr(counts, name, getattr(counts, name) + getattr(result.counts, name))
            at = {"chunk": chunk, "bin": tokens.tell(), "sizes": sizes.tell()}
            entry = {**at, "counts": vars(counts)}
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            if on_chunk:
                on_chunk(counts)


def _prepared_before(
    out: Output, inputs: list[sources.Source], settings: dict[str, Any]
) -> dict[str, Any] | None:
    """The manifest of the corpus at the prefix when a run of `inputs` and `settings` would
    write the same (nothing to do); None when there is no corpus there. A ConfigError naming
    its files when there is another, or a damaged one: a run replaces it only with
    --overwrite."""
    finals = (out.bin, out.idx, out.json)
    found = [path for path in finals if path.exists()]
    if not found:
        return None
    record, why = None, None
    try:
        record = manifest.read_manifest(out.prefix)
    except ConfigError as exc:
        why = f"whose manifest is damaged ({exc.message})"
    if len(found) < len(finals):
        why = f"that lacks {', '.join(p.name for p in finals if p not in found)}"
    elif record is None:
        why = why or "without a manifest that says what made it"
    elif problem := indexed.index_problem(out.idx, out.bin):
        why = f"that is damaged ({problem})"
    else:
        why = manifest.made_otherwise(
            record, inputs, settings["tokenizer"], settings["key"], settings["eod"]
        )
    if why is None:
        return record
    raise ConfigError(
        f"{out.prefix} already holds a corpus ({', '.join(map(str, found))}) {why}: pass "
        "--overwrite to replace it",
        hint="the files are replaced only once the new corpus is done; or prepare into "
        "another --output",
    )


def default_workers() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def prepare(
    request: Request,
    on_start: Callable[[Plan], None] | None = None,
    on_chunk: Callable[[Counts], None] | None = None,
) -> Prepared:
    """Prepare the corpus `request` describes; see the module's docstring."""
    try:
        import numpy  # noqa: F401
    except ImportError as exc:
        raise ConfigError("preparing data needs numpy", hint=INSTALL) from exc
    start = time.monotonic()
    inputs = sources.expand(request.inputs)
    out = Output(request.prefix)
    clash = {str(p.resolve()) for p in out.all()} & {str(Path(s.path).resolve()) for s in inputs}
    if clash:
        raise ConfigError(f"the output would overwrite the input {sorted(clash)[0]}")
    tokenizer, directory = load_tokenizer(request.tokenizer)
    file = tokenizer_file(request.tokenizer)
    eod = find_eod(tokenizer, directory, request.eod_token) if request.append_eod else None
    vocab = max(vocab_size_of(tokenizer), eod.id + 1 if eod else 0)
    dtype = indexed.token_dtype(vocab)
    chunks = sources.plan(inputs, request.chunk_bytes, request.key)
    digest = manifest.sha256(file)
    settings = {
        "tokenizer": digest,
        "key": request.key,
        "dtype": dtype,
        "eod": None if eod is None else eod.id,
        "chunk_bytes": request.chunk_bytes,
    }
    workers = request.workers or default_workers()
    run = _Run(out, request.key, (str(file), None if eod is None else eod.id, dtype), on_chunk)
    try:
        made = None if request.overwrite else _prepared_before(out, inputs, settings)
        if made is not None:
            empty = made.get("empty_documents_skipped")
            empty = empty if isinstance(empty, int) else 0
            size = sum(s.size for s in inputs)
            counts = Counts(made["documents"], empty, made["tokens"], size)
            files = [out.bin, out.idx, out.json]
            seconds = time.monotonic() - start
            return Prepared(counts, vocab, eod, dtype, request.prefix, seconds, 0, files, True)
        why = unwritable(request.prefix.parent)
        if why:
            raise ConfigError(f"cannot write the corpus {request.prefix}: {why}")
        out.lock()
        done, counts, note = out.resume(manifest.fingerprint(inputs, settings))
        workers = min(workers, max(len(chunks) - done, 1))  # no more than chunks to do
        if on_start:
            total = sum(s.size for s in inputs)
            copy = Counts(**vars(counts))
            on_start(Plan(eod, vocab, dtype, workers, len(chunks), done, total, copy, note))
        hashes = run.tokenize(chunks, done, counts, workers, inputs)
        if counts.documents == 0:
            hashes.cancel()
            out.discard()
            held = f"only {counts.empty} that tokenize to nothing" if counts.empty else "none"
            raise ConfigError(f"no documents to write: the input holds {held}")
        with out.partial_idx.open("wb") as idx, out.partial_sizes.open("rb") as sizes:
            indexed.write_index(idx, sizes, dtype)
        record = manifest.Manifest(
            counts.documents, counts.empty, counts.tokens, dtype, vocab, request.key,
            request.chunk_bytes, request.command,
        )  # fmt: skip
        tokenizer_record = {"path": str(file.resolve()), "sha256": digest}
        manifest.write_manifest(
            out.partial_json, record, eod, tokenizer_record, inputs, hashes.result, request.prefix
        )
        out.finish()
    except OSError as exc:
        raise PrimusError(f"cannot prepare {request.prefix}.bin/.idx: {exc}") from exc
    finally:
        out.unlock()
    seconds = time.monotonic() - start
    files = [out.bin, out.idx, out.json]
    return Prepared(counts, vocab, eod, dtype, request.prefix, seconds, done, files)


@dataclass
class _Run:
    """The tokenizing part of a run."""

    out: Output
    key: str
    worker_args: tuple[str, int | None, str]  # tokenizer file, EOD id, dtype
    on_chunk: Callable[[Counts], None] | None

    def tokenize(
        self,
        chunks: list[sources.Chunk],
        done: int,
        counts: Counts,
        workers: int,
        inputs: list[sources.Source],
    ) -> manifest.SourceHashes:
        """Tokenize the chunks from `done` on into the partial files, the sources hashed
        meanwhile. A bad document drops the partial output: the input has to change, and
        with it what the output would be."""
        todo = chunks[done:]
        args = (*self.worker_args, self.key)
        hashes = None
        try:
            if workers == 1:
                _start_worker(*args, None)
                hashes = manifest.SourceHashes(inputs)
                _append(self.out, map(tokenize, todo), done, counts, self.on_chunk)
                return hashes
            context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
            pool = ProcessPoolExecutor(workers, context, _start_worker, (*args, os.getpid()))
            hashed: list[manifest.SourceHashes] = []

            def started() -> None:  # a thread, so after the workers are forked
                hashed.append(manifest.SourceHashes(inputs))

            try:
                results = _in_order(pool, todo, 2 * workers, started)
                _append(self.out, results, done, counts, self.on_chunk)
            except KeyboardInterrupt:  # Ctrl-C: stop now; the journal holds the chunks done
                for process in list(pool._processes.values()):
                    process.kill()
                raise
            finally:
                hashes = hashed[0] if hashed else None
                pool.shutdown(wait=True, cancel_futures=True)
            assert hashes is not None  # there were chunks to do: `started` ran
            return hashes
        except BaseException as exc:
            if hashes is not None:
                hashes.cancel()
            if isinstance(exc, sources.BadInput):
                self.out.discard()
                raise exc.error() from None
            if isinstance(exc, BrokenProcessPool):
                raise PrimusError(
                    "a tokenizing worker died (killed, or out of memory?); the chunks done are "
                    "kept",
                    hint="run the same command again to continue (with fewer --workers or a "
                    "smaller --chunk-size if memory ran out)",
                ) from None
            raise
        finally:
            _WORKER.clear()
