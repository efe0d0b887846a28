"""Fine-tuning: SFT rows through a TorchTitan dataloader, LoRA, and the posttrain patches."""
