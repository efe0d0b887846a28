"""Megatron's own forward on checkpoints, for the HF conversion tests. Run as a script (under
`torch.distributed.run` for several ranks):

    python megatron_forward.py JOBS.json

Each job (a JSON object) names an experiment `exp` (with `overrides`, and the `stage`
whose trainer sets it up: pretrain unless given), optionally an HF
directory `hf` to import first (`primus checkpoint import`'s code path), a token-id file
`tokens` (torch.save'd, batch x seq) and an output file `out`; with `export`, the checkpoint is
exported there afterwards. For each job the model is built as the trainer builds it (patches,
providers), the checkpoint in its `load` folder is loaded as the trainer would load it (an HF
import: weights only), and `out` receives the logits (batch, seq, vocab; gathered over TP, from
the last pipeline stage) and, with `samples: true`, the mock-data samples of the first two
training steps. Jobs run one after another in this process (Megatron's state reset between).
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch


def _forward(tokens: torch.Tensor, data: Any, model: Any) -> tuple[torch.Tensor, Any]:
    seq = tokens.shape[1]
    positions = torch.arange(seq, device=tokens.device).expand_as(tokens)
    mask = torch.tril(torch.ones(1, 1, seq, seq, device=tokens.device)) < 0.5
    return model(tokens, positions, mask), lambda out, non_loss_data=True: out


def run(job: dict[str, Any]) -> None:
    from primus.core.runtime.primus_runtime import PrimusRuntime

    stage = job.get("stage", "pretrain")
    runtime = PrimusRuntime(Path(job["exp"]), job.get("overrides", []), stage)
    if job.get("hf"):
        runtime.import_hf(Path(job["hf"]))
    args = runtime.backend_args()
    # global args; weights only if imported (posttrain with LoRA: the frozen weights' folder)
    runtime.adapter.load_trainer_class(stage)(backend_args=args).setup()

    from megatron.core import parallel_state as ps
    from megatron.core.enums import ModelType
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from megatron.training.checkpointing import load_checkpoint
    from megatron.training.global_vars import destroy_global_vars
    from megatron.training.initialize import initialize_megatron
    from megatron.training.training import get_model, get_train_valid_test_num_samples

    from primus.backends.megatron import providers

    initialize_megatron()
    model = get_model(providers.model_provider, ModelType.encoder_or_decoder, wrap_with_ddp=False)
    load_checkpoint(model, None, None)
    for module in model:
        module.eval()
    tokens = torch.load(job["tokens"]).to(next(model[0].parameters()).device)
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
    samples = []
    if job.get("samples"):
        train, _, _ = providers.datasets_provider([get_train_valid_test_num_samples()[0], 0, 0])
        samples = [train[i] for i in range(2 * args.global_batch_size)] if train else []
    if ps.is_pipeline_last_stage():
        logits = gather_from_tensor_model_parallel_region(outputs[0])  # every TP rank takes part
        if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            torch.save({"logits": logits, "samples": samples}, job["out"])
    torch.distributed.barrier()
    ps.destroy_model_parallel()
    destroy_global_vars()
    destroy_rerun_state_machine()
    destroy_num_microbatches_calculator()
    if job.get("export"):
        runtime.export_hf(None, Path(job["export"]))


def main(jobs_file: str) -> None:
    for job in json.loads(Path(jobs_file).read_text()):
        run(job)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
