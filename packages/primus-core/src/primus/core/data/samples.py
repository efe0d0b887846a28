"""The training samples of a prepared corpus in the indexed format's standard GPT sample order
(the order of the format's reference trainer, which reads the corpus natively), so that every
backend reading a corpus through this module trains on the same sample sequence.

For `num_samples` samples of `seq_length` + 1 tokens (inputs and the next-token targets) from
every sequence of the corpus (the whole corpus for training), with one `numpy.random.RandomState`
seeded by `seed`:

    epochs      the fewest whose tokens cover num_samples * seq_length + 1
    documents   the sequence ids repeated once per epoch, shuffled; when the last epoch would
                give fewer than 80% of an epoch's samples, the earlier epochs are shuffled
                together and the last apart (a "separate final epoch")
    stream      the documents' tokens end to end; sample j is stream[j * L : j * L + L + 1]
                (L = seq_length: consecutive samples share one token)
    order       sample positions shuffled; apart too for the separate final epoch

Sample i of training is sample `order[i]` of the stream: the reference sampler hands a step the
samples step * G .. step * G + G - 1 (G the global batch), and so must every reader.
"""

from __future__ import annotations

from typing import Any

from primus.core.data.indexed import IndexedCorpus

FINAL_EPOCH_SHARE = 0.80  # the threshold for shuffling the last epoch apart


class CorpusSamples:
    """Samples of `seq_length` + 1 tokens from `corpus` in the standard GPT sample order:
    `samples[i]` is training sample i (int64), `len(samples)` how many the epochs hold (at
    least `num_samples`)."""

    def __init__(self, corpus: IndexedCorpus, seq_length: int, num_samples: int, seed: int) -> None:
        import numpy as np

        if seq_length < 2:
            raise ValueError(f"seq_length must be at least 2, got {seq_length}")
        self.corpus, self.seq_length, self.seed = corpus, seq_length, seed
        sizes = np.asarray(corpus.sizes, dtype=np.int64)
        per_epoch = int(sizes.sum())
        if per_epoch <= 1:
            raise ValueError(f"{corpus.bin_path} holds {per_epoch} tokens: too few for a sample")
        epochs = max(1, -(-(num_samples * seq_length + 1) // per_epoch))
        separate, before_last = False, 0
        if epochs > 1:
            before_last = ((epochs - 1) * per_epoch - 1) // seq_length
            from_last = num_samples - before_last
            separate = from_last < int(FINAL_EPOCH_SHARE * ((per_epoch - 1) // seq_length))
        rng = np.random.RandomState(seed)
        sequences = np.arange(len(sizes), dtype=np.int32)
        if separate:
            documents = np.concatenate(
                [_shuffled_epochs(sequences, epochs - 1, rng), _shuffled_epochs(sequences, 1, rng)]
            )
        else:
            documents = _shuffled_epochs(sequences, epochs, rng)
        self.documents = documents
        self.ends = np.cumsum(sizes[documents])  # where each document ends in the stream
        total = (epochs * per_epoch - 1) // seq_length
        dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
        first = np.arange(before_last if separate else total, dtype=dtype)
        rng.shuffle(first)
        if separate:
            last = np.arange(before_last, total, dtype=dtype)
            rng.shuffle(last)
            first = np.concatenate([first, last])
        self.order = first
        self.epochs, self.last_epoch_apart = epochs, separate

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> Any:
        """Training sample `i`: seq_length + 1 token ids (int64)."""
        import numpy as np

        start = int(self.order[i]) * self.seq_length
        end = start + self.seq_length + 1
        parts = []
        doc = int(np.searchsorted(self.ends, start, side="right"))
        at = start
        while at < end:
            begin = int(self.ends[doc - 1]) if doc else 0
            tokens = self.corpus[int(self.documents[doc])]
            take = min(end, int(self.ends[doc])) - at
            parts.append(tokens[at - begin : at - begin + take])
            at += take
            doc += 1
        return np.concatenate(parts).astype(np.int64)

    def order_settings(self) -> dict[str, Any]:
        """What decides the sample order (a longer schedule within the same epochs keeps it)."""
        return {"corpus": str(self.corpus.bin_path), "seq_length": self.seq_length,
                "seed": self.seed, "epochs": self.epochs,
                "last_epoch_apart": bool(self.last_epoch_apart)}  # fmt: skip

    def describe(self) -> str:
        apart = " (the last shuffled apart)" if self.last_epoch_apart else ""
        return (
            f"{len(self)} samples of {self.seq_length} + 1 tokens from {self.corpus.bin_path} "
            f"over {self.epochs} epoch{'s' if self.epochs > 1 else ''}{apart}"
        )


def _shuffled_epochs(sequences: Any, epochs: int, rng: Any) -> Any:
    """`sequences` once per epoch, shuffled together (the document index)."""
    import numpy as np

    documents = np.tile(sequences, epochs).astype(np.int32)
    rng.shuffle(documents)
    return documents
