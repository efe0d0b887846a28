"""What a run leaves to read: outputs in the run directory, log routing, step metrics."""
