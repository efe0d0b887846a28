"""What a run leaves to read: outputs in the run directory, step metrics."""
