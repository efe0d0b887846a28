"""The records checked before any framework is imported (`primus.core.config.inputs`): each
record's format, and with `sft.truncate` off, each sample's length against `seq_length + 1`,
so that a record too long fails a dry run, `config validate` and a run in seconds, not once
the model is built.

The length needs the tokenizer, loaded here without torch (which AutoTokenizer imports):
its class is the one `tokenizer_config.json` names, taken from transformers. A chat's length
is its rendering's tokens, exactly what the build encodes; a prompt/completion's is counted
without the tokenizer's special tokens around the prompt (at most one fewer than the build's),
so a sample refused here is always refused by the build. Where the class is not named or
does not load, only the build checks lengths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from primus.core.config.posttrain import SFTConfig
from primus.core.logging import log_rank_0
from primus.core.posttrain.encode import Encoder, too_long
from primus.core.posttrain.records import Record, iter_records

GENERIC = ("PreTrainedTokenizerFast", "TokenizersBackend")  # AutoTokenizer: TokenizersBackend
BATCH = 512  # records tokenized together
COUNTED = 20_000  # records whose lengths the check counts (about 1-2 s)


def light_tokenizer(cfg: SFTConfig) -> Any | None:
    """The HF tokenizer of `sft.tokenizer`, loaded without AutoTokenizer (so without torch);
    None where tokenizer_config.json names no class transformers has."""
    folder = Path(cfg.tokenizer)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        name = config.get("tokenizer_class")
        if not isinstance(name, str) or not (folder / "tokenizer.json").is_file():
            return None
        import transformers

        names = ("TokenizersBackend",) if name in GENERIC else (name.removesuffix("Fast"), name)
        cls = next((c for c in (getattr(transformers, n, None) for n in names) if c), None)
        return None if cls is None else cls.from_pretrained(str(folder))
    except Exception as exc:  # any failure leaves the lengths to the build, which loads it
        log_rank_0(f"sft: lengths checked when the data is built ({exc})", logging.DEBUG)
        return None


def _samples(record: Record) -> Iterator[tuple[str, Record]]:
    """A record's samples, each with its name in an error ('' or the pair's side)."""
    if record.format == "preference":
        chosen, rejected = record.sides()
        yield "the chosen answer's ", chosen
        yield "the rejected answer's ", rejected
    else:
        yield "", record


def _check_batch(encoder: Encoder, batch: list[Record], cfg: SFTConfig) -> None:
    tokenizer = encoder.tokenizer
    named = [(what, sample) for record in batch for what, sample in _samples(record)]
    # a chat's rendering; a prompt/completion's prompt, then its completion and EOS counted
    # apart (their special tokens aside)
    texts = [
        encoder.render(s, s.messages, False) if s.messages is not None else s.prompt or ""
        for _, s in named
    ]
    completions = [(i, s.completion or "") for i, (_, s) in enumerate(named) if s.messages is None]
    extra = [0] * len(named)
    if completions:
        counted = tokenizer([c for _, c in completions], add_special_tokens=False, verbose=False)
        for (index, _), ids in zip(completions, counted["input_ids"], strict=True):
            extra[index] = len(ids) + 1
    if cfg.format == "preference":  # rendered alike: the same tokens on both sides
        for index in range(0, len(named), 2):
            chosen = named[index][1]
            if chosen.messages is not None and texts[index] == texts[index + 1]:
                raise chosen.error(
                    "'chosen' and 'rejected' render the same after the prompt",
                    hint="a pair teaches nothing unless its answers differ",
                )
    if cfg.truncate:
        return
    lengths = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    for (what, sample), ids, more in zip(named, lengths, extra, strict=True):
        tokens = len(ids) + more
        if tokens > cfg.seq_length + 1:
            raise too_long(sample.where, tokens, cfg, what, bound=sample.messages is None)


def check_records(cfg: SFTConfig) -> None:
    """Every record of `sft.train`'s and `sft.eval`'s files (a bad one: a ConfigError at its
    file:line), read as a stream; with `sft.truncate` off, the first `COUNTED` records' samples
    longer than `seq_length + 1` tokens too, and with dpo, pairs whose chats render alike
    (the build counts every record; counting costs about as much as the build's encoding, so
    a large corpus is not counted twice). Imports transformers (not torch) for the lengths."""
    files = [(f.path, f.columns) for f in cfg.train]
    files += [(cfg.eval, cfg.columns)] if cfg.eval else []
    count = not cfg.truncate or cfg.format == "preference"
    encoder: Encoder | None = None
    batch: list[Record] = []
    seen = 0
    for path, columns in files:
        for record in iter_records(path, cfg.format, columns):
            seen += 1
            if not count or seen > COUNTED:
                continue
            batch.append(record)
            if len(batch) == BATCH or seen == COUNTED:
                encoder = encoder or _encoder(cfg)
                if encoder is None:
                    count = False
                else:
                    _check_batch(encoder, batch, cfg)
                batch = []
    if batch and (encoder := encoder or _encoder(cfg)) is not None:
        _check_batch(encoder, batch, cfg)
    if count and seen > COUNTED:
        log_rank_0(f"sft: the first {COUNTED:,} of {seen:,} records' lengths checked before "
                   "the launch; the rest when the data is built")  # fmt: skip


def _encoder(cfg: SFTConfig) -> Encoder | None:
    tokenizer = light_tokenizer(cfg)
    return None if tokenizer is None else Encoder(tokenizer, cfg)
