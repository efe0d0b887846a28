"""Data: the checks of a module's data inputs (corpora from core's `primus data prepare`,
tokenizers) and the data patches."""
