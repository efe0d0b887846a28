"""Fine-tuning: SFT rows as MaxText batches, the eval step, and the posttrain patches."""
