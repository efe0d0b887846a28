"""Launching workers: torchrun or the spawner, Slurm, the rank environment, and the reapers
and helper-process discipline that leave nothing behind."""
