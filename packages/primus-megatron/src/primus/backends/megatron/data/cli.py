"""`primus data prepare`: a plugin command (entry point group `primus.commands`).

Imports neither torch nor megatron until the command runs. Progress goes to stderr, the
summary (with the params to train on the data) to stdout.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from primus.cli.common import Debug

if TYPE_CHECKING:
    from primus.backends.megatron.data.prepare import Eod, Prepared

app = typer.Typer(
    help="Prepare training data for the Megatron backend.",
    no_args_is_help=True,
    add_completion=False,
)


class Rates(ProgressColumn):
    """Documents and tokens so far, and per second."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        docs, tokens = task.fields.get("docs", 0), task.fields.get("tokens", 0)

        def rate(n: int) -> str:
            return f" {_short(n / elapsed)}/s" if elapsed else ""

        return Text(f"{docs:,} docs{rate(docs)} · {tokens:,} tokens{rate(tokens)}")


def _short(x: float) -> str:
    for unit in ("", "k", "M"):
        if x < 1000:
            return f"{x:.0f}{unit}" if unit == "" else f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}G"


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size:,} B" if size < 1000 else f"{_short(size)}B"


def training_overrides(result: Prepared) -> dict[str, str | int]:
    """The Megatron params that train on the prepared data (pre-tokenized: NullTokenizer)."""
    params: dict[str, str | int] = {
        "data_path": str(result.bin_path.with_suffix("").resolve()),
        "tokenizer_type": "NullTokenizer",
        "vocab_size": result.vocab_size,
    }
    if result.eod is not None:
        params["null_tokenizer_eod_id"] = result.eod.id
    return params


def _summary(result: Prepared) -> str:
    empty = f" ({result.empty:,} empty, skipped)" if result.empty else ""
    params = training_overrides(result)
    lines = [
        f"prepared {result.documents:,} documents{empty}, {result.tokens:,} tokens "
        f"({result.dtype}) in {result.seconds:.1f} s",
        *(f"  wrote {p}  {_size(p)}" for p in (result.bin_path, result.idx_path)),
        "train on it with these params in the module's overrides:",
        *(f"  {key}: {value}" for key, value in params.items()),
        "or on the command line: "
        + " ".join(shlex.quote(f"{key}={value}") for key, value in params.items()),
    ]
    return "\n".join(lines)


@app.command("prepare")
def prepare(
    input_path: Annotated[
        Path,
        typer.Option(
            "--input", "-i", help="JSONL corpus: one JSON object per line.", show_default=False
        ),
    ],
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
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Output prefix: writes PREFIX.bin and PREFIX.idx.",
            show_default=False,
        ),
    ],
    json_key: Annotated[str, typer.Option("--json-key", help="The key holding the text.")] = "text",
    append_eod: Annotated[
        bool,
        typer.Option("--append-eod/--no-append-eod", help="End each document with an EOD token."),
    ] = True,
    eod_token: Annotated[
        str | None,
        typer.Option(
            "--eod-token",
            help="The EOD token (default: the tokenizer's eos_token or end-of-text token).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="Tokenizer threads (default: all cores)."),
    ] = None,
    debug: Debug = False,
) -> None:
    """Tokenize a JSONL corpus into Megatron's indexed dataset (PREFIX.bin, PREFIX.idx)."""
    from primus.backends.megatron.data.prepare import prepare as run_prepare

    console = Console(stderr=True)
    columns = (
        BarColumn(bar_width=16),
        TaskProgressColumn(),
        Rates(),
        TimeElapsedColumn(),
    )
    progress = Progress(*columns, console=console)
    prefix = Path(str(output).removesuffix(".bin").removesuffix(".idx"))

    def on_start(eod: Eod | None, vocab: int) -> None:
        what = "none (--no-append-eod)"
        if eod is not None:
            what = f"{eod.token!r} id {eod.id}" if eod.token else f"id {eod.id}"
            what += f" ({eod.source})"
        console.print(f"vocab size {vocab:,}; EOD token: {what}", highlight=False)
        progress.add_task("tokenizing", total=input_path.stat().st_size, docs=0, tokens=0)
        progress.start()

    def on_batch(docs: int, tokens: int, nbytes: int) -> None:
        task = progress.tasks[0]
        docs, tokens = task.fields["docs"] + docs, task.fields["tokens"] + tokens
        progress.update(task.id, advance=nbytes, docs=docs, tokens=tokens)

    console.print(f"preparing {input_path} with tokenizer {tokenizer}", highlight=False)
    try:
        result = run_prepare(
            input_path,
            tokenizer,
            prefix,
            json_key=json_key,
            append_eod=append_eod,
            eod_token=eod_token,
            workers=workers,
            on_start=on_start,
            on_batch=on_batch,
        )
    finally:
        if progress.live.is_started:
            progress.stop()
    sys.stdout.write(_summary(result) + "\n")
