"""On the GPU: a random HF model of Llama-3.2-1B's published shape, imported into Megatron at the
start of `primus train` (`init_from`) with the 1B recipe (bf16, sequence 4096), trains 20 steps;
step 1's loss is transformers' loss on the same batch (Megatron's mock-data samples of step 1,
as megatron_forward.py reads them), within bf16's tolerance."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from primus.testing.hf_models import make_published_model
from primus.testing.runs import losses, primus

pytestmark = pytest.mark.gpu
RECIPE = Path(__file__).parents[3] / "configs" / "megatron" / "llama3.2_1B-pretrain.yaml"
FORWARD = Path(__file__).with_name("megatron_forward.py")


def test_a_llama32_1b_shaped_hf_model_trains_from_its_weights(tmp_path: Path) -> None:
    from primus.backends.megatron.checkpoint.native import preset_from_hf
    from primus.core.checkpoint.hf import read_config

    hf = tmp_path / "hf"
    make_published_model(hf, "llama3.2_1B")
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset_from_hf(read_config(hf))))
    module = {"model": str(tmp_path / "preset.yaml"), "init_from": {"hf": str(hf)}}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"extends": str(RECIPE), "workspace": str(tmp_path / "ws"),
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    done = primus("train", "pretrain", "--config", str(exp), "exp_name=gpu1b", "train_iters=20",
                  "log_interval=1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    curve = losses(next((tmp_path / "ws").rglob("gpu1b")))  # Primus's metrics start at step 2
    assert sorted(curve) == list(range(2, 21)) and curve[20] < curve[2]
    first = re.search(r"iteration\s+1/\s*20 \|.*?lm loss: ([0-9.E+-]+)", done.stdout + done.stderr)
    assert first is not None  # Megatron's own line for step 1

    # Megatron's step-1 batch: the first global batch of its mock data (no checkpoint to load
    # here: a separate workspace, so the forward job imports nothing and only reads samples)
    tokens = tmp_path / "tokens.pt"
    torch.save(torch.zeros(1, 8, dtype=torch.long), tokens)
    job = {"exp": str(exp), "tokens": str(tokens), "out": str(tmp_path / "samples.pt"),
           "samples": True, "overrides": [f"workspace={tmp_path / 'fwd'}", "exp_name=fwd"]}  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    done = subprocess.run([sys.executable, str(FORWARD), str(tmp_path / "jobs.json")],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    samples = torch.load(tmp_path / "samples.pt", weights_only=False)["samples"][:8]
    batch = {
        k: torch.stack([s[k] for s in samples]).cuda() for k in ("tokens", "labels", "loss_mask")
    }

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16).cuda().eval()
    total = count = 0.0
    with torch.no_grad():
        for i in range(len(samples)):  # one sample at a time, as Megatron's micro batch of 1
            logits = model(batch["tokens"][i : i + 1]).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits[0], batch["labels"][i], reduction="none"
            )
            total += float((loss * batch["loss_mask"][i]).sum())
            count += float(batch["loss_mask"][i].sum())
    assert float(first.group(1)) == pytest.approx(total / count, rel=2e-2)
