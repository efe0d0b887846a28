"""Plain megatron-core, no Primus: the peer in tools/bench/bench_megatron.py.

Megatron-LM's pretrain_gpt.py flow on mock data, as a user of the megatron-core wheel writes it
(the wheel ships megatron.training but not pretrain_gpt.py): flags from the command line,
upstream's own GPT model builder (`gpt_config_from_args`), Megatron's MockGPTDataset, and a
one-GPU forward step. Launch with torchrun:

    torchrun --nproc-per-node 1 tools/bench/megatron_plain.py --num-layers 16 ... --mock-data
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from megatron.core.datasets import utils as dataset_utils
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.training import get_args, get_tokenizer, pretrain
from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
from megatron.training.arguments import parse_args, validate_args
from megatron.training.global_vars import set_global_variables


def datasets(num_samples: list[int], vp_stage: int | None = None) -> Any:
    args = get_args()
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        split=args.split,
        tokenizer=get_tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=args.create_attention_mask_in_dataloader,
    )
    return BlendedMegatronDatasetBuilder(MockGPTDataset, num_samples, lambda: True, config).build()


datasets.is_distributed = True  # type: ignore[attr-defined]


def loss(mask: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    mask = mask.view(-1).float()
    total = torch.sum(output.view(-1).float() * mask)
    tokens = mask.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.cat([total.detach().view(1), tokens.view(1)])}


def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
    batch = {k: v.cuda(non_blocking=True) for k, v in next(data_iterator).items() if v is not None}
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch.get("attention_mask"),
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
    )
    return output, partial(loss, batch["loss_mask"])


def main() -> None:
    dataset_utils.compile_helpers = lambda: None  # the wheel ships the helper built, no Makefile
    args = parse_args()
    validate_args(args, {})
    set_global_variables(args)
    cfg = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(cfg, datasets, ModelType.encoder_or_decoder, forward_step)


if __name__ == "__main__":
    main()
