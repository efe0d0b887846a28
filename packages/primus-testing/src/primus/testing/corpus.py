"""A tiny pretraining corpus and tokenizer without the hub, for `primus data prepare`'s tests.

Needs `tokenizers`; test-only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "layer", "token", "model", "rope", "über", "数据"]


def corpus_texts(n: int, seed: int = 0) -> list[str]:
    """`n` short documents of random words; documents 5 and 77 (when there) are empty."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(n)]
    for empty in (5, 77):
        if empty < n:
            texts[empty] = ""
    return texts


def write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    """One JSON object per text (an id and the text under `key`), and a blank line at 10."""
    lines = [json.dumps({"id": i, key: t}, ensure_ascii=False) for i, t in enumerate(texts)]
    lines.insert(min(10, len(lines)), "")  # blank lines are not documents
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_tokenizer(special: list[str], vocab_size: int = 300) -> Any:
    """A byte-level BPE tokenizer trained on `corpus_texts`, `<unk>` and `special` first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

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


def tokenizer_dir(directory: Path) -> Path:
    """A Hugging Face tokenizer directory whose eos_token (`<doc_end>`) only
    tokenizer_config.json names."""
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer(["<doc_end>"]).save(str(directory / "tokenizer.json"))
    config = {"eos_token": {"content": "<doc_end>", "special": True}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def expected_documents(tokenizer_path: Path, texts: list[str], eod: int) -> list[list[int]]:
    """The ids `primus data prepare` writes for `texts`: each non-empty one, then `eod`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    encoded = (tokenizer.encode(text).ids for text in texts)
    return [[*ids, eod] for ids in encoded if ids]


def prepared_reverse_task(prefix: Path, texts: int, seed: int, max_words: int) -> Path:
    """`texts` texts of the reverse task's words (`sft_data.reverse_task`), prepared at
    `prefix` (`primus data prepare`) with the shipped tokenizer (vocabulary 61); the prefix."""
    from primus.core.data.prepare import Request, prepare
    from primus.testing.sft_data import reverse_task
    from primus.testing.sft_runs import REPO, SHIPPED

    source = prefix.parent / f"{prefix.name}-text.jsonl"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    words = reverse_task(texts, seed=seed, max_words=max_words)
    source.write_text("".join(json.dumps({"text": " ".join(w)}) + "\n" for w in words))
    prepare(Request([str(source)], REPO / SHIPPED / "tokenizer", prefix))
    return prefix
