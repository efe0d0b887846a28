"""The trainer contract."""
