"""The files an experiment reads, checked before any framework is imported and before anything
is written: a missing, empty or malformed input is a ConfigError at the key that names it, in
seconds rather than after the framework's start-up. Core checks what core reads (`init_from`'s
HF directory, the `sft:` records); each backend checks its own data keys
(`BackendAdapter.check_inputs`) with the helpers here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.config.experiment import ModuleConfig
from primus.core.errors import ConfigError, Origin

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def is_remote(value: Any) -> bool:
    """A URL (s3://, gs://, hf://, msc://...): the backend reads it, nothing here checks it."""
    return "://" in str(value)


def input_path(
    module: ModuleConfig, key: str, value: Any, what: str, kind: str = "file",
    hint: str | None = None,
) -> Path:  # fmt: skip
    """`value` (set at `key`) as an existing `kind` ("file": readable and not empty, "folder",
    or "any"), else a ConfigError at `key` that says what is wrong with which path."""
    path = Path(str(value)).expanduser()
    fix = hint or f"set {key} to the {what} (relative paths start where primus runs)"
    if not path.exists():
        raise module.error(key, f"{key}: {what} {path} does not exist", fix)
    if kind != "any" and (kind == "folder") != path.is_dir():
        raise module.error(key, f"{key}: {what} {path} is not a {kind}", fix)
    if path.is_file():
        try:
            with path.open("rb") as stream:
                empty = not stream.read(1)
        except OSError as exc:
            raise module.error(
                key, f"{key}: {what} {path} cannot be read: {exc.strerror}"
            ) from None
        if empty:
            raise module.error(key, f"{key}: {what} {path} is empty", fix)
    return path


def check_tokenizer_folder(module: ModuleConfig, key: str, value: Any) -> Path:
    """An HF tokenizer folder: one holding tokenizer.json, tokenizer_config.json or a
    SentencePiece tokenizer.model."""
    folder = input_path(module, key, value, "the tokenizer folder", kind="folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise module.error(
            key,
            f"{key}: {folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
            "point it at a Hugging Face tokenizer folder (save_pretrained writes one)",
        )
    return folder


PREPARE = "primus data prepare makes a corpus: PREFIX.bin and PREFIX.idx"


def check_corpus(module: ModuleConfig, key: str, prefix: str) -> dict[str, Any] | None:
    """The prepared corpus PREFIX (named by `key`) has a readable .idx and .bin that agree (a
    ConfigError at the key otherwise); its manifest (PREFIX.json), or None without one."""
    from primus.core.data.indexed import index_problem
    from primus.core.data.manifest import read_manifest

    idx = input_path(module, key, f"{prefix}.idx", "the index file", hint=PREPARE)
    data = Path(f"{prefix}.bin").expanduser()
    if not data.is_file():  # an empty one is judged against its index
        input_path(module, key, data, "the token file", hint=PREPARE)
    problem = index_problem(idx, data)
    if problem:
        raise module.error(key, f"{key}: {problem}", f"make it again: {PREPARE}")
    return read_manifest(Path(prefix).expanduser())


def _one_tokenizer(manifests: dict[Path, dict[str, Any] | None], origin: Origin | None) -> None:
    """The corpora of a blend were prepared with one tokenizer and end-of-document id (those
    with a manifest): blended token ids of two vocabularies would be noise to the model."""
    made = {
        prefix: ((record.get("tokenizer") or {}).get("sha256"), (record.get("eod") or {}).get("id"))
        for prefix, record in manifests.items()
        if record is not None
    }
    if len(set(made.values())) > 1:
        (first, one), *others = made.items()
        second, other = next((p, m) for p, m in others if m != one)
        what = "tokenizer" if one[0] != other[0] else "end-of-document id"
        raise ConfigError(
            f"data.path blends corpora prepared with another {what}: {first} and {second} "
            f"(their manifests {first}.json, {second}.json)",
            origin,
            "prepare every corpus of a blend with the model's tokenizer",
        )


def check_hf_model(folder: Path) -> None:
    """The HF model in `folder` has a readable config.json and whole safetensors files (their
    headers, and files as long as the headers say): a ConfigError otherwise."""
    from primus.core.checkpoint.hf import read_config, safetensors_files, safetensors_header

    read_config(folder)
    for weights in safetensors_files(folder):
        safetensors_header(weights)


def check_inputs(module: ModuleConfig) -> None:
    """Core's inputs: `init_from`'s config.json and safetensors headers, `data:`'s corpora,
    and every `sft:` record (a bad one is file:line; one too long for a row too). Reads files,
    imports no framework (transformers without torch, for the records' lengths)."""
    if module.init_from is not None:
        try:
            check_hf_model(module.init_from)
        except ConfigError as exc:
            exc.origin = exc.origin or module.init_from_origin
            raise
    if module.data is not None:
        manifests = {}
        for corpus in module.data.corpora:
            try:
                manifests[corpus.prefix] = check_corpus(module, "data.path", str(corpus.prefix))
            except ConfigError as exc:
                exc.origin = exc.origin or module.data.origins.get("path")
                raise
        _one_tokenizer(manifests, module.data.origins.get("path"))
    if module.sft is not None:  # its files' presence and the tokenizer: checked at load
        from primus.core.posttrain.check import check_records

        check_records(module.sft)
