"""Preference-training test data and an independent DPO loss: the reverse task as preference
pairs (chosen: the words reversed, rejected: the words as given), and the loss of a batch of
pairs computed with transformers in float64 from two HF models. Test-only; imports torch
and transformers where used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus.testing.sft_data import reverse_task


def write_preference_task(
    folder: Path, n_train: int = 64, n_eval: int = 0, seed: int = 0, chat: bool = True
) -> dict[str, Path]:
    """The reverse task as TRL preference records: conversational (`prompt`, `chosen` and
    `rejected` lists of messages) or, with chat False, strings; `train` (and `eval`) files.
    Prompts that read the same reversed are left out (their two answers would be one)."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn = reverse_task(2 * (n_train + n_eval), seed)
    prompts = [w for w in drawn if w != w[::-1]][: n_train + n_eval]  # answers that differ
    files = {}
    for split, chunk in (("train", prompts[:n_train]), ("eval", prompts[n_train:])):
        if not chunk:
            continue
        records: list[dict[str, Any]] = []
        for words in chunk:
            prompt, good, bad = " ".join(words), " ".join(reversed(words)), " ".join(words)
            if chat:
                records.append({
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}],
                })  # fmt: skip
            else:
                records.append({"prompt": f"reverse : {prompt} =", "chosen": good, "rejected": bad})
        path = folder / f"preference_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        files[split] = path
    return files


def hf_sequence_logps(hf_dir: Path, batch: dict[str, Any]) -> Any:
    """Each side's summed log-probability of its labels over its loss mask under the HF model
    in `hf_dir`, in float64: batch as `PairDataset.batch` gives it -> (pairs, 2)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64).eval()
    tokens, labels, mask, positions = (
        torch.as_tensor(batch[k]).flatten(0, 1)
        for k in ("tokens", "labels", "loss_mask", "position_ids")
    )
    with torch.no_grad():
        logits = model(tokens.long(), position_ids=positions.long()).logits
    logps = torch.log_softmax(logits, dim=-1).gather(-1, labels.long()[..., None])[..., 0]
    return (logps * mask.double()).sum(-1).view(-1, 2)


def hf_dpo_loss(
    policy_dir: Path,
    reference_dir: Path,
    batch: dict[str, Any],
    beta: float,
    smoothing: float = 0.0,
) -> dict[str, float]:
    """The DPO loss and reward metrics of a batch of pairs, float64, written out here apart
    from Primus's own `dpo_loss_torch`: the reference for a backend's logged step."""
    import torch

    policy, reference = (
        hf_sequence_logps(policy_dir, batch),
        hf_sequence_logps(reference_dir, batch),
    )
    chosen, rejected = (
        beta * (policy[:, 0] - reference[:, 0]),
        beta * (policy[:, 1] - reference[:, 1]),
    )
    margin = chosen - rejected
    sigmoid = torch.sigmoid(margin)
    losses = -(1 - smoothing) * torch.log(sigmoid) - smoothing * torch.log(1 - sigmoid)
    return {
        "loss": losses.mean().item(),
        "reward_chosen": chosen.mean().item(),
        "reward_rejected": rejected.mean().item(),
        "reward_margin": margin.mean().item(),
        "reward_accuracy": (margin > 0).double().mean().item(),
    }


def assert_reference_pass_stopped(done: Any, exp: Path, signal_name: str | None = None) -> None:
    """A DPO run with `dpo.precompute_reference` (its `done` process result) that a stop signal
    ended during the reference's pass: exit 75 before the first step (the message naming
    `signal_name`, where given), the pass not finished, the run dir marked for a requeue."""
    from primus.core.reliability import preemption
    from primus.testing.sft_runs import run_dir

    assert done.returncode == preemption.EXIT_PREEMPTED, done.stderr[-3000:]
    said = f"{signal_name} before" if signal_name else "before"
    assert f"{said} the first step: nothing new to save" in done.stderr
    run = run_dir(exp)
    assert "precomputed in" not in (run / "logs" / "rank-0.log").read_text()
    assert preemption.marked(run)["step"] is None  # type: ignore[index]
