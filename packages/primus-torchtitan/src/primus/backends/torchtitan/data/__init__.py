"""Data: mock and local datasets, the data position across a data-parallel change, patches."""
