"""Megatron's own forward on a checkpoint, for the HF conversion tests; run as a script (under
`torch.distributed.run` for several ranks):

    python megatron_forward.py EXP.yaml TOKENS.pt OUT.pt [OVERRIDE ...]

builds the model of experiment EXP.yaml as the trainer does (patches, providers), loads the
checkpoint in its `load` folder the way the trainer would (an HF import: weights only), and
writes to OUT.pt the logits (batch, seq, vocab; gathered over TP, from the last pipeline stage)
for the token ids in TOKENS.pt, and the mock-data samples of the first two training steps.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch


def _forward(tokens: torch.Tensor, data: Any, model: Any) -> tuple[torch.Tensor, Any]:
    seq = tokens.shape[1]
    positions = torch.arange(seq).expand_as(tokens)
    mask = torch.tril(torch.ones(1, 1, seq, seq)) < 0.5
    return model(tokens, positions, mask), lambda out, non_loss_data=True: out


def main(exp: str, tokens_file: str, out_file: str, *overrides: str) -> None:
    from primus.backends.megatron.pretrain_trainer import MegatronPretrainTrainer
    from primus.core.runtime.primus_runtime import PrimusRuntime

    args = PrimusRuntime(Path(exp), list(overrides)).backend_args()
    MegatronPretrainTrainer(backend_args=args).setup()  # global args; weights only if imported

    from megatron.core import parallel_state as ps
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from megatron.training.checkpointing import load_checkpoint
    from megatron.training.initialize import initialize_megatron
    from megatron.training.training import get_model, get_train_valid_test_num_samples

    from primus.backends.megatron import providers

    initialize_megatron()
    model = get_model(providers.model_provider, ModelType.encoder_or_decoder, wrap_with_ddp=False)
    load_checkpoint(model, None, None)
    for module in model:
        module.eval()
    tokens = torch.load(tokens_file)
    with torch.no_grad():
        outputs = get_forward_backward_func()(
            forward_step_func=partial(_forward, tokens),
            data_iterator=iter([None]),
            model=model,
            num_microbatches=1,
            seq_length=tokens.shape[1],
            micro_batch_size=tokens.shape[0],
            forward_only=True,
            collect_non_loss_data=True,
        )
    train_samples = get_train_valid_test_num_samples()[0]
    train, _, _ = providers.datasets_provider([train_samples, 0, 0])
    if ps.is_pipeline_last_stage():
        logits = gather_from_tensor_model_parallel_region(outputs[0])  # every TP rank takes part
        if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            samples = [train[i] for i in range(2 * args.global_batch_size)]
            torch.save({"logits": logits, "samples": samples}, out_file)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
