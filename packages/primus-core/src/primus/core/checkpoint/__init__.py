"""Checkpoints: Hugging Face directories read as plain files, and what backends recognise."""
