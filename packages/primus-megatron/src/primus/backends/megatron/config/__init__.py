"""Megatron's args from Primus params (`bridge`)."""
