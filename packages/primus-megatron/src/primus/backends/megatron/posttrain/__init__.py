"""Fine-tuning: SFT rows as Megatron samples, LoRA, and the posttrain patches."""
