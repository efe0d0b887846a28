"""Data: `primus data prepare` (tokenizing into indexed datasets) and the data patches."""
