"""Stopping a run at a step with a checkpoint: preemption, non-finite steps."""
