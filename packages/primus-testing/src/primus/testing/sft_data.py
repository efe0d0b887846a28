"""Fine-tuning test data without the hub: a tiny Llama-3-style HF tokenizer, and a synthetic
task (answer = the prompt's words reversed) that no pretraining data teaches.

Needs `tokenizers` (and `transformers` to load the tokenizer, torch for `hf_eval_stats`); test-only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

BOS, EOT, END, PAD, UNK = (
    "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<unk>",
)  # fmt: skip
HEADER = ("<|start_header_id|>", "<|end_header_id|>")
SPECIAL_TOKENS = (BOS, END, PAD, UNK, EOT, *HEADER)
ROLES = ("system", "user", "assistant")
WORDS = (
    "apple", "river", "stone", "cloud", "green", "quick", "lamp", "north", "paper", "seven",
    "tiger", "music", "orange", "silver", "window", "garden", "bread", "candle", "forest",
    "planet", "rocket", "summer", "winter", "yellow", "violet", "mirror", "pencil", "bottle",
    "castle", "dragon", "feather", "island", "jacket", "kettle", "ladder", "marble", "needle",
    "ocean", "pillow", "rabbit", "saddle", "tunnel", "velvet", "wagon", "zebra", "anchor",
    "basket", "copper",
)  # fmt: skip
VOCAB = (*SPECIAL_TOKENS, *ROLES, *WORDS, "reverse", ":", "=")
# Meta's Llama 3 template (tokenizer_config.json of Llama-3.2-1B-Instruct, less the tool and
# date parts): header, content, <|eot_id|> per message.
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def write_tokenizer(folder: Path, chat_template: str | None = LLAMA3_TEMPLATE) -> Path:
    """A word-level HF tokenizer over VOCAB (ids in VOCAB's order; BOS prepended like Llama 3's),
    saved as tokenizer.json + tokenizer_config.json; `AutoTokenizer.from_pretrained(folder)`
    loads it. Returns `folder`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB.index(BOS))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": 4096,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def reverse_task(n: int, seed: int, min_words: int = 3, max_words: int = 8) -> list[list[str]]:
    """`n` prompts of random words from WORDS; the answer to each is its words reversed."""
    rng = random.Random(seed)
    return [rng.choices(WORDS, k=rng.randint(min_words, max_words)) for _ in range(n)]


def write_reverse_task(
    folder: Path, n_train: int = 512, n_eval: int = 64, seed: int = 0, system: bool = False
) -> dict[str, Path]:
    """The reverse task as chat JSONL (`chat_train`, `chat_eval`) and prompt/completion JSONL
    (`pc_train`, `pc_eval`), the same prompts in both; train and eval drawn apart."""
    folder.mkdir(parents=True, exist_ok=True)
    prompts = reverse_task(n_train + n_eval, seed)
    files = {}
    for split, chunk in (("train", prompts[:n_train]), ("eval", prompts[n_train:])):
        chats, pairs = [], []
        for words in chunk:
            prompt, answer = " ".join(words), " ".join(reversed(words))
            head = [{"role": "system", "content": "reverse"}] if system else []
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            chats.append({"messages": head + turns})
            pairs.append({"prompt": f"reverse : {prompt} =", "completion": answer})
        for kind, records in (("chat", chats), ("pc", pairs)):
            path = folder / f"{kind}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            files[f"{kind}_{split}"] = path
    return files


def hf_eval_stats(hf_dir: Path, dataset: Any) -> Any:
    """Teacher-forced TokenStats of the HF model in `hf_dir` (transformers, fp32) over every
    row of an unpacked SFTDataset: the framework-independent reference for a backend's
    eval_loss and eval_token_accuracy (unpacked, since transformers' eager attention would let
    packed samples see each other). Imports torch."""
    import torch
    from transformers import AutoModelForCausalLM

    from primus.core.posttrain.metrics import TokenStats, token_stats_torch

    assert all(len(samples) == 1 for samples in dataset.rows), "needs sft.packing: false"
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    total = TokenStats()
    with torch.no_grad():
        for index in range(len(dataset)):
            row = {k: torch.as_tensor(v)[None] for k, v in dataset[index].items()}
            logits = model(row["tokens"].long(), position_ids=row["position_ids"].long()).logits
            total += TokenStats(
                *token_stats_torch(logits, row["labels"], row["loss_mask"]).tolist()
            )
    return total
