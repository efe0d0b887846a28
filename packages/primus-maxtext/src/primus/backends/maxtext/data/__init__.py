"""Data: a prepared corpus read in Megatron's sample order, rows by global position, and the
data position of a grain pipeline, global across a change of process count."""
