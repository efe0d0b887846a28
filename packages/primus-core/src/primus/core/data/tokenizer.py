"""The Hugging Face `tokenizers` tokenizer of `primus data prepare`, and its end-of-document id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from primus.core.errors import ConfigError, json_type

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# End-of-text tokens of common tokenizer families, tried when the tokenizer names none.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
INSTALL = "pip install 'primus-core[data]'"


@dataclass(frozen=True)
class Eod:
    """The end-of-document id, its token (None for an id past the vocabulary) and why."""

    id: int
    token: str | None
    source: str


def tokenizer_file(path: Path) -> Path:
    """The tokenizer.json of a tokenizer directory or file."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"no tokenizer.json in {path}" if path.is_dir() else f"tokenizer not found: {path}",
            hint="pass a Hugging Face tokenizer directory or its tokenizer.json file",
        )
    return file


def load_tokenizer(path: Path) -> tuple[Tokenizer, Path]:
    """A tokenizer from a tokenizer.json file or a directory holding one, and its directory."""
    file = tokenizer_file(path)
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ConfigError("preparing data needs the tokenizers package", hint=INSTALL) from exc
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
    """tokenizer_config.json's eos_token (None where it names none); a ConfigError for a file
    that is not a JSON object or an eos_token that is not a token (its EOD would silently be
    another token)."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        record = json.loads(config.read_bytes())
    except (OSError, ValueError) as exc:
        record = exc
    hint = "repair or remove it, or name the token with --eod-token"
    if not isinstance(record, dict):
        raise ConfigError(f"{config}: not a JSON object, so its eos_token is unknown", hint=hint)
    eos = record.get("eos_token")
    token = eos.get("content") if isinstance(eos, dict) else eos
    if token is not None and not isinstance(token, str):
        field = "eos_token.content" if isinstance(eos, dict) else "eos_token"
        raise ConfigError(f"{config}: {field} must be a string, got {json_type(token)}", hint=hint)
    return token


def find_eod(tokenizer: Tokenizer, directory: Path, token: str | None = None) -> Eod:
    """The EOD id: `token` if given, else tokenizer_config.json's eos_token (which must be in
    the vocabulary), else a common end-of-text token, else a new id one past the vocabulary
    (never a real token's id)."""
    if token is not None:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ConfigError(
                f"--eod-token {token!r} is not in the vocabulary of the tokenizer in {directory}"
            )
        return Eod(token_id, token, "--eod-token")
    eos = _configured_eos(directory)
    if eos is not None:
        eos_id = tokenizer.token_to_id(eos)
        if eos_id is None:
            raise ConfigError(
                f"{directory / 'tokenizer_config.json'}: eos_token {eos!r} is not in the "
                f"vocabulary of the tokenizer in {directory}",
                hint="name a token of the vocabulary as eos_token, or with --eod-token",
            )
        return Eod(eos_id, eos, "eos_token in tokenizer_config.json")
    for candidate in EOD_CANDIDATES:
        token_id = tokenizer.token_to_id(candidate)
        if token_id is not None:
            return Eod(token_id, candidate, "the tokenizer's end-of-text token")
    size = vocab_size_of(tokenizer)
    return Eod(size, None, "the tokenizer has no end-of-text token: a new id past its vocabulary")
