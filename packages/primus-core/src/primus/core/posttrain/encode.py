"""Records into tokens and a loss mask, with the HF tokenizer and its (or the config's) chat
template.

Chat: the loss covers what the template emits for each assistant message after the
generation prompt: the content and the end of turn (Llama 3: `<|eot_id|>`), not the role
header. Few templates mark that span (`{% generation %}`), so it is found by rendering
prefixes: render(messages[:i], add_generation_prompt=True) must be a prefix of
render(messages[:i+1]), itself a prefix of the whole chat's rendering; the text between the
two is the span, and a token is trained on when it starts inside one.
Prompt/completion: tokenizer(prompt) (with the tokenizer's BOS), then the completion's tokens
and EOS; the loss covers the completion and EOS.
With `sft.train_on_prompt` the loss covers every token (the prompt's too).
Preference: each side (the prompt with the chosen, or the rejected, answer) as above; in a
chat only the answer's assistant turns are in the mask, not those of the prompt.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from primus.core.config.posttrain import SFTConfig
from primus.core.errors import ConfigError, Origin
from primus.core.posttrain.records import Record, data_error


@dataclass(frozen=True)
class Sample:
    """One record's tokens; `mask[i]` is True where token i is trained on."""

    tokens: list[int]
    mask: list[bool]
    where: Origin


def load_tokenizer(cfg: SFTConfig) -> Any:
    """The HF tokenizer of `sft.tokenizer` (default: the init_from directory), which must be a
    fast one (the mask needs its character offsets). Imports transformers."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(cfg.tokenizer))
    except (OSError, ValueError) as exc:
        raise cfg.error(
            "tokenizer", f"cannot load the tokenizer in {cfg.tokenizer}: {exc}"
        ) from None
    if not tokenizer.is_fast:
        raise cfg.error(
            "tokenizer",
            f"the tokenizer in {cfg.tokenizer} is not a fast (tokenizers) one",
            hint="the loss mask needs character offsets: save it with tokenizer.json",
        )
    return tokenizer


class Encoder:
    """Encodes records with one tokenizer and chat template."""

    def __init__(self, tokenizer: Any, cfg: SFTConfig) -> None:
        self.tokenizer = tokenizer
        self.template = cfg.chat_template
        self.cfg = cfg
        where = cfg.origins.get("chat_template")
        self.template_source = (
            "the chat template of sft.chat_template" + (f" ({where})" if where else "")
            if self.template
            else f"the chat template of the tokenizer in {cfg.tokenizer}"
        )

    def encode(self, record: Record) -> Sample:
        if record.format == "preference":
            raise record.error(
                "a preference record (chosen, rejected): fine-tuning on it is preference "
                "training", hint="add dpo: {beta: 0.1} to the module (docs/posttrain.md)",
            )  # fmt: skip
        if record.messages is not None:
            return self._chat(record, record.messages)
        assert record.prompt is not None and record.completion is not None
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise self.cfg.error(
                "tokenizer", f"the tokenizer in {self.cfg.tokenizer} has no EOS token",
                hint="prompt/completion samples end with EOS: set eos_token in tokenizer_config.json",
            )  # fmt: skip
        prompt = self.tokenizer(record.prompt)["input_ids"]
        completion = [
            *self.tokenizer(record.completion, add_special_tokens=False)["input_ids"],
            eos,
        ]
        mask = [self.cfg.train_on_prompt] * len(prompt) + [True] * len(completion)
        return Sample(prompt + completion, mask, record.where)

    def render(self, record: Record, messages: list[dict[str, Any]], generation: bool) -> str:
        """`messages` as the chat template writes them (with the assistant's generation prompt
        after them with `generation`): the text the tokenizer encodes."""
        if self.template is None and self.tokenizer.chat_template is None:
            raise self.cfg.error(
                "tokenizer",
                f"the tokenizer in {self.cfg.tokenizer} has no chat template, and "
                f"{record.where} is a chat",
                hint="set sft.chat_template (a Jinja template or a file holding one)",
            )
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=generation,
            )
        except Exception as exc:  # jinja's errors, and the template's own raise_exception
            raise record.error(f"{self.template_source} failed: {exc}") from None

    def _chat(self, record: Record, messages: list[dict[str, Any]]) -> Sample:
        text = self.render(record, messages, False)
        if self.cfg.train_on_prompt:
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return Sample(list(tokens), [True] * len(tokens), record.where)
        spans: list[tuple[int, int]] = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i < record.train_from:
                continue
            before = self.render(record, messages[:i], True)
            after = self.render(record, messages[: i + 1], False)
            if not after.startswith(before) or not text.startswith(after):
                shorter, longer = (
                    (f"messages[:{i}] with the generation prompt", f"messages[:{i + 1}]")
                    if not after.startswith(before)
                    else (f"messages[:{i + 1}]", "the whole chat")
                )
                raise record.error(
                    f"messages[{i}]: {self.template_source} renders {shorter} as text that is "
                    f"not a prefix of its rendering of {longer}, so the assistant's tokens "
                    "cannot be told apart",
                    hint="use a template that renders each message the same whatever follows "
                    "it (sft.chat_template)",
                )
            spans.append((len(before), len(after)))
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [start for start, _ in spans]
        mask = []
        for start, end in encoded["offset_mapping"]:
            k = bisect.bisect_right(starts, start) - 1
            mask.append(end > start and k >= 0 and start < spans[k][1])
        if not any(mask):
            raise record.error(f"{self.template_source} renders no assistant tokens for this chat")
        return Sample(list(encoded["input_ids"]), mask, record.where)


def too_long(
    where: Origin, tokens: int, cfg: SFTConfig, what: str = "", bound: bool = False
) -> ConfigError:
    """The error of a sample of `tokens` tokens (`bound`: at least) longer than a row; `what`
    names it ('' or the pair's side: "the chosen answer's ")."""
    return data_error(
        where,
        f"{what}sample is {'at least ' if bound else ''}{tokens} tokens, more than "
        f"seq_length + 1 = {cfg.seq_length + 1}",
        hint="set sft.truncate: true to cut it, or a larger sft.seq_length",
    )


def check_length(sample: Sample, cfg: SFTConfig, what: str = "") -> Sample | None:
    """A sample that fits a row (at most seq_length + 1 tokens: each position's target is the
    next token); with `truncate`, a longer one is cut, or None if nothing to train on is left.
    `what` names the sample in the error ('' or the pair's side)."""
    limit = cfg.seq_length + 1
    if len(sample.tokens) <= limit:
        return sample
    if not cfg.truncate:
        raise too_long(sample.where, len(sample.tokens), cfg, what)
    if not any(sample.mask[1:limit]):
        return None
    return Sample(sample.tokens[:limit], sample.mask[:limit], sample.where)
