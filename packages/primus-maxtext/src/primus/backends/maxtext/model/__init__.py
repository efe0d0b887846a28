"""Model definitions: where MaxText's model differs from the checkpoints it loads (RoPE scaling,
tied logits, the query scale)."""
