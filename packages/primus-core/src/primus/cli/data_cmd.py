"""`primus data`: prepare training data in the indexed format (.bin/.idx) that every backend
reads, and inspect a prepared corpus. Imports numpy and the tokenizer only when a command runs.
Progress goes to stderr, the summary to stdout."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from primus.cli.common import Debug
from primus.core.progress import ProgressLine

if TYPE_CHECKING:
    from primus.core.data.journal import Counts
    from primus.core.data.prepare import Plan, Prepared

app = typer.Typer(
    help="Prepare training data (the indexed format, .bin/.idx) and inspect it.",
    no_args_is_help=True,
    add_completion=False,
)


def short(x: float) -> str:
    """1234567 -> 1.2M."""
    for unit in ("", "k", "M"):
        if x < 1000:
            return f"{x:.0f}{unit}" if unit == "" else f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}G"


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size:,} B" if size < 1000 else f"{short(size)}B"


class CorpusProgress(ProgressLine):
    """The progress line of a prepare: documents, tokens, MB/s and, the input size being known,
    the share done and the time left."""

    def __init__(self, plan: Plan, stream: TextIO | None = None) -> None:
        super().__init__(plan.total_bytes, stream=stream, done_bytes=plan.done_counts.bytes)
        self.corpus = plan.done_counts

    def update(self, counts: Counts) -> None:
        self.corpus, self.done = counts, counts.bytes
        self.tick()

    def counts(self) -> list[str]:
        return [f"{self.corpus.documents:,} docs", f"{self.corpus.tokens:,} tokens"]


def _eod_text(plan: Plan) -> str:
    eod = plan.eod
    if eod is None:
        return "none (--no-append-eod)"
    what = f"{eod.token!r} id {eod.id}" if eod.token else f"id {eod.id}"
    return f"{what} ({eod.source})"


def _summary(result: Prepared) -> str:
    counts = result.counts
    eod = "none" if result.eod is None else result.eod.id
    corpus = (
        f"the corpus: prefix {result.prefix.resolve()}, vocab size {result.vocab_size}, "
        f"end-of-document id {eod}"
    )
    if result.already:
        return (
            f"already prepared from these inputs and settings: {counts.documents:,} documents, "
            f"{counts.tokens:,} tokens ({result.dtype}); nothing to do (--overwrite prepares "
            f"it again)\n{corpus}"
        )
    empty = f" ({counts.empty:,} empty, skipped)" if counts.empty else ""
    chunks = f"{result.resumed} chunk" + "s" * (result.resumed != 1)
    resumed = f"; {chunks} by the run before" if result.resumed else ""
    lines = [
        f"prepared {counts.documents:,} documents{empty}, {counts.tokens:,} tokens "
        f"({result.dtype}) in {result.seconds:.1f} s{resumed}",
        *(f"  wrote {p}  {_size(p)}" for p in result.files),
        corpus,
    ]
    return "\n".join(lines)


def chunk_size(text: str) -> int:
    """'4M' or '4MiB' -> 4 MiB; K, M and G count in 1024s; a bare number is bytes."""
    from primus.core.sizes import parse_bytes

    value = parse_bytes(text)
    if value is None:
        raise typer.BadParameter(f"--chunk-size {text!r}: a size such as 4M, 512KiB or 1048576")
    if value < 1:
        raise typer.BadParameter(f"--chunk-size {text!r}: at least one byte")
    return value


@app.command("prepare")
def prepare(
    tokenizer: Annotated[
        Path,
        typer.Option(
            "--tokenizer",
            "-t",
            help="Hugging Face tokenizer: a directory with tokenizer.json, or the file.",
            show_default=False,
        ),
    ],
    output: Annotated[
        str,  # not a Path: that would drop the trailing "/" of a folder
        typer.Option(
            "--output",
            "-o",
            help="Output prefix: writes PREFIX.bin, PREFIX.idx and the manifest PREFIX.json.",
            show_default=False,
        ),
    ],
    files: Annotated[
        list[str] | None,
        typer.Argument(
            help="Input files, read before those of --input (a shell's glob expands here).",
            metavar="FILE...",
            show_default=False,
        ),
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            help="An input file or a quoted glob ('data/*.jsonl'); repeat for several. By "
            "suffix: .parquet (the --key column), .txt (UTF-8, one document per file), "
            "anything else JSON Lines (one object per line, the text under --key).",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str,
        typer.Option("--key", "--json-key", help="The JSON key, or parquet column, of the text."),
    ] = "text",
    append_eod: Annotated[
        bool,
        typer.Option(
            "--append-eod/--no-append-eod", help="End each document with an end-of-document id."
        ),
    ] = True,
    eod_token: Annotated[
        str | None,
        typer.Option(
            "--eod-token",
            help="The end-of-document token (default: eos_token of tokenizer_config.json, "
            "else the tokenizer's end-of-text token, else a new id past the vocabulary).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Tokenizing processes (default: the cores); 1 tokenizes in this process. "
            "The output is the same for any number.",
        ),
    ] = None,
    chunk: Annotated[
        str,
        typer.Option(
            "--chunk-size",
            help="Input per unit of work (K, M, G): a worker's memory, and what a killed run "
            "redoes (a parquet row group is one unit). The output is the same for any size; a "
            "run continues a killed one only at the same size.",
        ),
    ] = "4M",
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace a corpus at the prefix that other inputs or settings made (without "
            "it, that is an error; one the same made is kept and nothing done).",
        ),
    ] = False,
    debug: Debug = False,
) -> None:
    """Tokenize text into the indexed format (PREFIX.bin, PREFIX.idx) and a manifest
    (PREFIX.json). Documents end with the end-of-document id; documents that tokenize to
    nothing are skipped. Run it again after a kill and it continues where it stopped."""
    from primus.core.data.prepare import Request
    from primus.core.data.prepare import prepare as run

    inputs = [*(files or []), *(inputs or [])]
    if not inputs:
        raise typer.BadParameter("name the files to tokenize (FILE... or --input FILE)")
    if not output.removesuffix(".bin").removesuffix(".idx").strip():
        raise typer.BadParameter(
            f"{output!r} names no prefix; name the corpus's, as corpus (writes corpus.bin, "
            "corpus.idx and corpus.json)",
            param_hint="--output",
        )
    if Path(output).is_dir() or output.endswith("/"):
        raise typer.BadParameter(
            f"{output} is a folder; the output is a prefix in one, as {Path(output) / 'corpus'} "
            "(writes corpus.bin, corpus.idx and corpus.json there)",
            param_hint="--output",
        )
    if eod_token is not None and not append_eod:
        raise typer.BadParameter(
            "--no-append-eod writes no end-of-document id, so the token would be unused; "
            "drop one of the two",
            param_hint="--eod-token",
        )
    prefix = Path(output.removesuffix(".bin").removesuffix(".idx"))
    args = [x for item in inputs for x in ("-i", item)] + ["-t", str(tokenizer), "-o", str(prefix)]
    args += ["--key", key, "--chunk-size", chunk]
    args += [] if append_eod else ["--no-append-eod"]
    args += [] if eod_token is None else ["--eod-token", eod_token]
    request = Request(
        inputs, tokenizer, prefix, key, append_eod, eod_token, workers, chunk_size(chunk),
        command="primus data prepare " + shlex.join(args), overwrite=overwrite,
    )  # fmt: skip
    progress: list[CorpusProgress] = []

    def on_start(plan: Plan) -> None:
        say = f"vocab size {plan.vocab_size:,} ({plan.dtype}); end-of-document: {_eod_text(plan)}"
        chunks = f"{plan.chunks} chunk" + "s" * (plan.chunks != 1)
        workers = f"{plan.workers} worker" + "s" * (plan.workers != 1)
        say += f"\n{plan.total_bytes / 1e6:,.1f} MB in {chunks}, {workers}"
        if plan.note:
            say += f"\nstarting over: {plan.note}"
        if plan.done:
            say += f"\ncontinuing: {plan.done} of {plan.chunks} chunks done by the run before"
        print(say, file=sys.stderr)
        progress.append(CorpusProgress(plan))

    try:
        try:
            result = run(request, on_start, lambda counts: progress[0].update(counts))
        finally:
            if progress:
                progress[0].finish()
    except KeyboardInterrupt:
        print("[primus] interrupted: the chunks done are kept; run the same command again to "
              "continue from them", file=sys.stderr)  # fmt: skip
        raise typer.Exit(130) from None
    sys.stdout.write(_summary(result) + "\n")


@app.command("inspect")
def inspect(
    prefix: Annotated[Path, typer.Argument(help="The corpus: PREFIX of PREFIX.bin/.idx.")],
    show: Annotated[int, typer.Option("--show", min=0, help="Print this many documents' ids.")] = 0,
    debug: Debug = False,
) -> None:
    """Check a prepared corpus (every index entry, the tokens it covers, no fewer and no more,
    the ids against the manifest's vocabulary for a .bin of up to 1 GiB) and print its counts
    and manifest."""
    import json

    from primus.core.data.indexed import IndexedCorpus, entries_problem, index_problem
    from primus.core.data.manifest import description_problem, ids_problem, read_manifest
    from primus.core.errors import ConfigError

    prefix = Path(str(prefix).removesuffix(".bin").removesuffix(".idx"))
    idx, data = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    if prefix.is_dir() and not idx.exists():
        pairs = [i for i in prefix.glob("*.idx") if i.is_file() and i.with_suffix(".bin").is_file()]
        found = sorted(str(i.with_suffix("")) for i in pairs)
        raise ConfigError(f"{prefix} is a folder: name a corpus prefix (PREFIX of PREFIX.bin/.idx)",
                          hint=f"the corpora in it: {', '.join(found)}" if found else
                          "primus data prepare makes a corpus")  # fmt: skip
    for path in (idx, data):
        if not path.is_file():
            why = f"{path} is not a file" if path.exists() else f"not found: {path}"
            raise ConfigError(why, hint="primus data prepare makes a corpus")
    problem = index_problem(idx, data) or entries_problem(idx, data)
    record, manifest = read_manifest(prefix), Path(f"{prefix}.json")
    if record is not None:
        problem = problem or ids_problem(prefix, record["vocab_size"], "its manifest's")
    if problem:
        raise ConfigError(problem, hint="make it again: primus data prepare")
    corpus = IndexedCorpus(prefix)
    if record is not None:
        counts = (len(corpus), corpus.token_count, str(corpus.dtype))
        if problem := description_problem(record, prefix, *counts):
            raise ConfigError(problem, hint="make the corpus again with primus data prepare, "
                              "or remove the manifest")  # fmt: skip
    print(f"{len(corpus):,} documents, {corpus.token_count:,} tokens ({corpus.dtype})")
    for i in range(min(show, len(corpus))):
        print(f"  {i}: {corpus[i].tolist()}")
    if record is not None:
        print("manifest:", json.dumps(record, indent=2))
    elif manifest.exists():
        print(
            f"manifest: {manifest} is not a manifest of this format (unreadable, or not its "
            "JSON): the ids are not checked against a vocabulary"
        )
    else:
        print("manifest: none")
