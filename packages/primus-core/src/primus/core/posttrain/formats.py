"""The record formats, each read into a chat (`messages`) or a prompt/completion pair:

    chat               {"messages": [{"role": ..., "content": ...}, ...]}
    prompt_completion  {"prompt": ..., "completion": ...}
    sharegpt           {"conversations": [{"from": "human", "value": ...}, ...], "system"?: ...}
    alpaca             {"instruction": ..., "input"?: ..., "output": ..., "system"?: ...,
                        "history"?: [[user, assistant], ...]}
    preference         {"prompt"?: ..., "chosen": ..., "rejected": ...} (TRL's: strings, or
                        lists of messages; without a prompt, the messages chosen and rejected
                        begin with alike are the prompt)

A preference record is two: the prompt with the chosen answer, and with the rejected one.

A `Columns` mapping renames the data's own keys to these first. A record that does not fit
raises `Invalid`, which the reader turns into an error at its file:line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from primus.core.config.sft_data import MESSAGE_COLUMNS, RECORD_COLUMNS
from primus.core.errors import did_you_mean, json_type

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's `from` -> the chat role. A function call is the assistant's (trained on, as the
# call's text); an observation is the tool's answer (like LLaMA-Factory's tags).
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool",
}  # fmt: skip
# An assistant message's keys that hold a tool call: its content may then be empty
TOOL_CALL_KEYS = ("tool_calls", "function_call")
# The keys that tell each format apart (under sft.format auto)
FORMAT_KEYS = {
    "chat": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "preference": ("chosen", "rejected"),
}
Fields = dict[str, Any]  # a Record's messages, or its prompt and completion


class Invalid(Exception):
    """Why a record does not fit its format (and a hint)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


class Columns:
    """`sft.columns`: the record keys a format reads -> the data's own keys."""

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        self.mapping = dict(mapping or {})

    def name(self, key: str) -> str:
        """How the data names `key`: 'prompt', or 'question' (prompt) where mapped."""
        column = self.mapping.get(key)
        return f"'{key}'" if column is None else f"'{column}' ({key})"

    def _renamed(self, data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        pairs = {k: c for k, c in self.mapping.items() if k in keys}
        if not pairs:
            return data
        kept = {k: v for k, v in data.items() if k not in pairs and k not in pairs.values()}
        return kept | {k: data[c] for k, c in pairs.items() if c in data}

    def record(self, data: dict[str, Any]) -> dict[str, Any]:
        """A record's keys as the formats name them."""
        return self._renamed(data, RECORD_COLUMNS)

    def message(self, data: dict[str, Any]) -> dict[str, Any]:
        """A message's (or turn's) keys as the formats name them."""
        return self._renamed(data, MESSAGE_COLUMNS)


def detect(data: dict[str, Any], columns: Columns, expected: str = "auto") -> str:
    """The one format whose keys the record has (what `expected` needs, where it has none)."""
    found = [f for f, keys in FORMAT_KEYS.items() if all(k in data for k in keys)]
    if len(found) == 1:
        return found[0]
    if found:
        raise Invalid(
            f"a record with the keys of several formats: {' and '.join(found)}",
            hint="one format per file: leave out the other format's keys, or map the keys "
            "to read with sft.columns",
        )
    formats = FORMAT_KEYS if expected == "auto" else {expected: FORMAT_KEYS[expected]}
    wanted = [" and ".join(map(columns.name, keys)) + f" ({f})" for f, keys in formats.items()]
    needs = " or ".join(filter(None, (", ".join(wanted[:-1]), wanted[-1])))
    has = ", ".join(map(repr, data)) or "nothing"
    raise Invalid(
        f"a record needs {needs}; it has {has}",
        hint="sft.columns maps the data's own keys to these, e.g. {prompt: question}",
    )


def _text(data: dict[str, Any], key: str, columns: Columns) -> str:
    """A string with more than whitespace."""
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        got = f"only whitespace {value!r}" if isinstance(value, str) and value else repr(value)
        raise Invalid(
            f"{columns.name(key)} must be a non-empty string, got {got}",
            hint="a record with nothing to train on (or to prompt with) cannot be a sample",
        )
    return value


def _optional_text(data: dict[str, Any], key: str, columns: Columns) -> str:
    """A string, or '' where missing or null."""
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise Invalid(
            f"{columns.name(key)} must be a string, got {json_type(value)}",
            hint="leave it out, or null, where there is none",
        )
    return value or ""


def _turns(data: dict[str, Any], key: str, columns: Columns) -> list[dict[str, Any]]:
    """The messages (or turns) under `key`, each a mapping, keys renamed."""
    turns = data[key]
    if not isinstance(turns, list) or not turns:
        got = "an empty one" if turns == [] else json_type(turns)
        raise Invalid(f"{columns.name(key)} must be a non-empty array, got {got}")
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise Invalid(f"{key}[{index}] is not an object, got {json_type(turn)}")
    return [columns.message(turn) for turn in turns]


def _content(turn: dict[str, Any], where: str, key: str, columns: Columns) -> None:
    value = turn.get(key)
    if not isinstance(value, str):
        got = "none" if key not in turn else json_type(value)
        raise Invalid(f"{where} {columns.name(key)} must be a string, got {got}")


def _messages(data: dict[str, Any], key: str, columns: Columns) -> list[dict[str, Any]]:
    """The messages under `key`, each with a known role and string content."""
    messages = _turns(data, key, columns)
    hint = f"roles: {', '.join(ROLES)}"
    for index, message in enumerate(messages):
        role, where = message.get("role"), f"{key}[{index}]"
        if role is None:
            raise Invalid(f"{where} has no {columns.name('role')}", hint)
        if role not in ROLES:
            raise Invalid(
                f"{where} has unknown role {role!r}"
                + (did_you_mean(role, ROLES) if isinstance(role, str) else ""),
                hint,
            )
        _content(message, where, "content", columns)
    return messages


def _answered(
    messages: list[dict[str, Any]], key: str, first: int = 0, after: str = ""
) -> list[dict[str, Any]]:
    """`messages`, refused where no assistant message answers (nothing to learn from) or where
    one is blank: its content empty or whitespace and no tool call (`tool_calls`,
    `function_call`) for the template to render; that would teach answering with nothing.
    `first`: the index in the record's `key` of messages[0], for the error; `after`: what the
    messages follow."""
    if not any(message["role"] == "assistant" for message in messages):
        raise Invalid(
            f"{key}{after} has no assistant message: nothing to train on",
            hint="add the assistant's answer, or leave the record out",
        )
    for index, message in enumerate(messages):
        calls = any(message.get(k) for k in TOOL_CALL_KEYS)
        if message["role"] == "assistant" and not message["content"].strip() and not calls:
            raise Invalid(
                f"{key}[{first + index}] is an assistant message with "
                f"{'only whitespace' if message['content'] else 'empty content'}: it would "
                "train the model to answer with nothing",
                hint="fill in the answer, or leave the record out",
            )
    return messages


def chat(data: dict[str, Any], columns: Columns) -> Fields:
    """`messages`, each with a known role and string content, one at least the assistant's."""
    return {"messages": _answered(_messages(data, "messages", columns), "messages")}


def sharegpt(data: dict[str, Any], columns: Columns) -> Fields:
    """`conversations` as messages (SHAREGPT_ROLES), the record's `system` first."""
    messages = []
    hint = f"'from' is one of {', '.join(SHAREGPT_ROLES)}"
    for index, turn in enumerate(_turns(data, "conversations", columns)):
        speaker, where = turn.get("from"), f"conversations[{index}]"
        if speaker is None:
            raise Invalid(f"{where} has no {columns.name('from')}", hint)
        if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
            close = did_you_mean(str(speaker), tuple(SHAREGPT_ROLES))
            raise Invalid(f"{where} has unknown {columns.name('from')} {speaker!r}{close}", hint)
        _content(turn, where, "value", columns)
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn["value"]})
    _answered(messages, "conversations")
    system = _optional_text(data, "system", columns)
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages}


def alpaca(data: dict[str, Any], columns: Columns) -> Fields:
    """system, history, instruction (+ blank line + input), output as messages."""
    instruction, output = (_text(data, k, columns) for k in ("instruction", "output"))
    extra, system = (_optional_text(data, k, columns) for k in ("input", "system"))
    messages = [{"role": "system", "content": system}] if system else []
    history = data.get("history")
    if history is not None and not isinstance(history, list):
        raise Invalid(
            f"{columns.name('history')} must be a list of [user, assistant] pairs",
            hint="history holds the earlier turns: [[user, assistant], ...]",
        )
    for index, pair in enumerate(history or []):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)
        ):
            raise Invalid(
                f"history[{index}] must be a pair of strings [user, assistant]",
                hint="history holds the earlier turns: [[user, assistant], ...]",
            )
        if not pair[1].strip():
            raise Invalid(
                f"history[{index}]'s answer is empty: it would train the model to answer with "
                "nothing", hint="fill in the answer, or leave the pair out",
            )  # fmt: skip
        messages += [
            {"role": "user", "content": pair[0]},
            {"role": "assistant", "content": pair[1]},
        ]
    user = f"{instruction}\n\n{extra}" if extra else instruction
    return {"messages": [*messages, {"role": "user", "content": user},
                         {"role": "assistant", "content": output}]}  # fmt: skip


def prompt_completion(data: dict[str, Any], columns: Columns) -> Fields:
    """`prompt` and `completion`, non-empty strings."""
    return {k: _text(data, k, columns) for k in ("prompt", "completion")}


def _answer(data: dict[str, Any], key: str, columns: Columns) -> Any:
    """A preference record's `chosen` or `rejected`: a string, or messages (checked as a chat)."""
    if isinstance(data.get(key), list):
        return _messages(data, key, columns)
    return _text(data, key, columns)


def preference(data: dict[str, Any], columns: Columns) -> Fields:
    """`chosen` and `rejected`, each a prompt/completion pair or a chat whose messages from
    `train_from` on are the answer."""
    chosen, rejected = (_answer(data, k, columns) for k in ("chosen", "rejected"))
    prompt = data.get("prompt")
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise Invalid("'chosen' and 'rejected' must both be strings or both lists of messages")
    if chosen == rejected:  # with an implicit prompt too: the same answer after it
        raise Invalid(
            "'chosen' and 'rejected' are the same",
            hint="a pair teaches nothing unless its answers differ",
        )
    if isinstance(chosen, str):
        if prompt is None:
            raise Invalid(
                f"{columns.name('prompt')} is missing",
                hint="a preference record of strings needs the prompt they answer",
            )
        if isinstance(prompt, list):
            raise Invalid(
                f"{columns.name('prompt')} is a list of messages but 'chosen' and 'rejected' "
                "are strings", hint="all three strings, or all three lists of messages",
            )  # fmt: skip
        text = _text(data, "prompt", columns)
        sides = [{"prompt": text, "completion": answer} for answer in (chosen, rejected)]
        return {"chosen": sides[0], "rejected": sides[1]}
    shared = 0
    if prompt is None:  # the messages both begin with: the prompt
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    elif isinstance(prompt, str):
        prompt = [{"role": "user", "content": _text(data, "prompt", columns)}]
    else:
        prompt = _messages(data, "prompt", columns)
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        _answered(answer, key, shared, " after the prompt")
    sides = [
        {"messages": [*prompt, *answer], "train_from": len(prompt)} for answer in (chosen, rejected)
    ]
    return {"chosen": sides[0], "rejected": sides[1]}


CONVERTERS: dict[str, Callable[[dict[str, Any], Columns], Fields]] = {
    "chat": chat,
    "prompt_completion": prompt_completion,
    "sharegpt": sharegpt,
    "alpaca": alpaca,
    "preference": preference,
}
