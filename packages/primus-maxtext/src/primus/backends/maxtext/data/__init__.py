"""Data: the data position of a grain pipeline, global across a change of process count."""
