"""Reliability: preemption (stop at a step with a checkpoint), non-finite steps, atomic writes
and disk-full errors."""
