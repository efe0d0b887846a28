"""The functions megatron.training's `pretrain()` calls: model, datasets, forward step and loss.

`layer_spec` is the slot kernel packages fill: a patch rebinds it here to swap modules in
the transformer layer (it is looked up at call time).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from megatron.core import parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.rerun_state_machine import get_rerun_state_machine
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
from megatron.training import get_args, get_timers, get_tokenizer, print_rank_0
from megatron.training.argument_utils import core_transformer_config_from_args
from megatron.training.utils.common_utils import get_blend_and_blend_per_split
from primus.core.posttrain import REFERENCE_KEY


def layer_spec(args: Any, config: TransformerConfig, vp_stage: int | None) -> Any:
    """The transformer layer (or block) spec: Transformer Engine's when `transformer_impl` asks
    for it, else Megatron's local modules; MoE models get the per-layer block spec."""
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        return get_gpt_decoder_block_spec(
            config,
            use_transformer_engine=use_te,
            normalization=args.normalization,
            qk_l2_norm=args.qk_l2_norm,
            vp_stage=vp_stage,
        )
    make = get_gpt_layer_with_transformer_engine_spec if use_te else get_gpt_layer_local_spec
    kwargs = {} if use_te else {"normalization": args.normalization}
    return make(args.num_experts, args.moe_grouped_gemm, args.qk_layernorm, **kwargs)


def rotary_kwargs(args: Any) -> dict[str, Any]:
    """GPTModel's rotary arguments from Megatron's args (also RotaryEmbedding's names)."""
    return {
        "rotary_percent": args.rotary_percent,
        "rotary_base": args.rotary_base,
        "rope_scaling": args.use_rope_scaling,
        "rope_scaling_factor": args.rope_scaling_factor,
        "seq_len_interpolation_factor": args.rotary_seq_len_interpolation_factor,
    }


def model_provider(
    pre_process: bool = True,
    post_process: bool = True,
    vp_stage: int | None = None,
    config: TransformerConfig | None = None,
    pg_collection: Any = None,
) -> GPTModel:
    """A GPT model (Llama-style or MoE, as the args say) for one pipeline stage."""
    args = get_args()
    config = config or core_transformer_config_from_args(args)
    spec = layer_spec(args, config, vp_stage)
    if not isinstance(spec, ModuleSpec | list) and not hasattr(spec, "layer_specs"):
        raise TypeError(f"layer_spec returned {type(spec).__name__}, not a ModuleSpec")
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        **rotary_kwargs(args),
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )
    if args.primus_peft is not None:  # `peft:` (fine-tuning): adapters on the frozen model
        from primus.backends.megatron.posttrain.lora import add_lora

        add_lora(model, args)
    reference = getattr(args, "primus_dpo_reference", None)
    if reference:  # full DPO (`dpo:` without `peft:`): the HF import, frozen, beside the model
        from primus.backends.megatron.posttrain.reference import keep_reference

        keep_reference(model, reference, args)
    return model


def _dataset_config(args: Any) -> GPTDatasetConfig:
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    return GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        path_to_cache=args.data_cache_path,
        mmap_bin_files=args.mmap_bin_files,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        data_parallel_size=args.data_parallel_size,
        context_parallel_size=args.context_parallel_size,
    )


def _built_on_this_rank() -> bool:
    """Data is read on the first and last pipeline stages, on tensor-parallel rank 0."""
    stage = parallel_state.is_pipeline_first_stage() or parallel_state.is_pipeline_last_stage()
    return stage and parallel_state.get_tensor_model_parallel_rank() == 0


def datasets_provider(train_val_test_num_samples: list[int], vp_stage: int | None = None) -> Any:
    """Megatron indexed datasets from `data_path`, or mock data with `mock_data: true`."""
    args = get_args()
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    print_rank_0(f"> building {dataset_type.__name__} train, validation and test datasets")
    return BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples, _built_on_this_rank, _dataset_config(args)
    ).build()


# Every rank calls the provider; the builder decides which ranks read (TP>1 deadlocks otherwise).
datasets_provider.is_distributed = True  # type: ignore[attr-defined]


def document_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Megatron's attention mask [..., 1, s, s] (bool, True where masked) of packed rows'
    sample ids [..., s]: a position attends to earlier positions of its own sample only."""
    same = segment_ids[..., :, None] == segment_ids[..., None, :]
    causal = torch.ones(same.shape[-2:], dtype=torch.bool, device=same.device).tril()
    return ~(same & causal).unsqueeze(-3)


def _to_gpu(value: Any) -> Any:
    return value.cuda(non_blocking=True) if isinstance(value, torch.Tensor) else value


def get_batch(
    data_iterator: Any, pairs: bool = False, reference: bool = False
) -> dict[str, torch.Tensor | None]:
    """This rank's micro-batch: read on TP rank 0, broadcast to the TP group, split for CP.
    `pairs`: a micro-batch of preference pairs (mbs, 2, seq), as 2 x mbs rows; `reference`:
    with their precomputed reference log-probabilities (REFERENCE_KEY, 2 x mbs)."""
    args = get_args()
    rows = args.micro_batch_size * (2 if pairs else 1)
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    if not (first or last):
        return {
            k: None for k in ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
        }
    tp_group = parallel_state.get_tensor_model_parallel_group()
    local = None
    if data_iterator is not None:  # TP rank 0 reads; the others receive the broadcast
        local = {k: _to_gpu(v) for k, v in next(data_iterator).items()}
        if pairs:
            local = {k: v.flatten(0, 1) for k, v in local.items()}
        if "segment_ids" in local:  # packed rows ship their ids, not an s x s mask
            local["attention_mask"] = document_mask(local.pop("segment_ids"))
    logps = local.pop(REFERENCE_KEY) if local is not None and reference else None
    if local is not None and first and last and tp_group.size() == 1:
        batch = local  # one TP rank, one stage: nothing to broadcast or drop
    else:
        batch = get_batch_on_this_tp_rank(
            local,
            has_cu_seqlens=False,
            is_hybrid_cp=False,
            create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
            broadcast_src_rank=parallel_state.get_tensor_model_parallel_src_rank(),
            broadcast_group=tp_group,
            cp_size=args.context_parallel_size,
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            micro_batch_size=rows,
            seq_length=args.seq_length,
            mtp_on_this_rank=False,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            is_pipeline_first_stage=first,
            is_pipeline_last_stage=last,
        )
        if reference:
            logps = _broadcast(logps, rows, tp_group)
    if args.context_parallel_size > 1:
        cp_group = parallel_state.get_context_parallel_group()
        batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=cp_group)
    if reference:
        batch[REFERENCE_KEY] = logps
    return batch


def _broadcast(values: torch.Tensor | None, size: int, group: Any) -> torch.Tensor:
    """`values` (float32, `size`) from the group's TP rank 0 to every rank of `group`."""
    if values is None:  # a receiving rank
        values = torch.empty(size, dtype=torch.float32, device=torch.cuda.current_device())
    src = parallel_state.get_tensor_model_parallel_src_rank()
    torch.distributed.broadcast(values, src, group=group)
    return values


def loss_func(
    loss_mask: torch.Tensor | None, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Sum of masked token losses, the token count, and both for logging (`lm loss`)."""
    assert loss_mask is not None, "the loss runs on the last pipeline stage, which has the mask"
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    if get_args().check_for_nan_in_loss_and_grad:  # off under megatron.nonfinite_args
        get_rerun_state_machine().validate_result(
            result=loss,
            rejection_func=torch.isnan,
            message="found NaN in local forward loss calculation",
            tolerance=0.0,
            fatal=True,
        )
    report = torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator: Any, model: GPTModel) -> tuple[torch.Tensor, Any]:
    """One micro-batch forward: the per-token losses, and how to reduce them."""
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_batch(data_iterator)
    timers("batch-generator").stop()
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch.get("attention_mask"),  # none where attention makes its causal mask itself
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
    )
    return output, partial(loss_func, batch["loss_mask"])
