"""The indexed format (.bin/.idx), written and read with numpy (imported on use).

PREFIX.bin holds the token ids of every document, back to back, in one integer type. PREFIX.idx
is, little-endian:

    b"MMIDIDX\\x00\\x00"  magic (9 bytes)
    version           uint64, 1
    dtype code        uint8 (DTYPES: 8 uint16, 4 int32, ...)
    sequence count    uint64, N
    document count    uint64, N + 1 (one more than the documents: the bounds of each)
    sizes             int32[N], the tokens of each sequence
    pointers          int64[N], the byte offset of each sequence in PREFIX.bin
    document indices  int64[N + 1], 0, 1, ..., N (a document is one sequence here)
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34  # magic 9, version 8, dtype code 1, sequence count 8, document count 8
# The dtype codes of the format: code -> (numpy name, bytes per token).
DTYPES = {
    1: ("uint8", 1), 2: ("int8", 1), 3: ("int16", 2), 4: ("int32", 4),
    5: ("int64", 8), 6: ("float64", 8), 7: ("float32", 4), 8: ("uint16", 2),
}  # fmt: skip
CODES = {name: code for code, (name, _) in DTYPES.items()}
BLOCK = 1 << 20  # index entries per read or write while streaming the index
SCAN_BYTES = 1 << 30  # the largest token file `id_range` reads (about a second)


def token_dtype(vocab_size: int) -> str:
    """The token type for ids below `vocab_size`, as the format's writers choose it."""
    return "uint16" if vocab_size < 65500 else "int32"


@dataclass(frozen=True)
class Header:
    """The fixed part of an .idx file."""

    version: int
    code: int
    sequences: int
    documents: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.code][1]


def read_header(idx: Path) -> Header | None:
    """The header of `idx`, or None when it does not start with the format's magic."""
    with idx.open("rb") as stream:
        head = stream.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:9] != MAGIC:
        return None
    (version,) = struct.unpack("<Q", head[9:17])
    sequences, documents = struct.unpack("<QQ", head[18:34])
    return Header(version, head[17], sequences, documents)


def index_problem(idx: Path, data: Path) -> str | None:
    """Why a reader of the format could not read the corpus `idx` indexes in `data`, or None."""
    header = read_header(idx)
    if header is None:
        return f"{idx} is not an index file of the indexed format (bad header)"
    if header.version != VERSION or header.code not in DTYPES:
        return f"{idx}: index version {header.version}, token type code {header.code}: unknown"
    sequences = header.sequences
    if sequences == 0:
        return f"{idx} indexes no documents: the corpus is empty"
    needed = HEADER_BYTES + sequences * 12 + header.documents * 8
    if idx.stat().st_size < needed:
        return f"{idx} is truncated: {idx.stat().st_size} bytes, its header needs {needed}"
    with idx.open("rb") as stream:
        stream.seek(HEADER_BYTES + (sequences - 1) * 4)
        (length,) = struct.unpack("<i", stream.read(4))
        stream.seek(HEADER_BYTES + sequences * 4 + (sequences - 1) * 8)
        (pointer,) = struct.unpack("<q", stream.read(8))
    if length < 0 or pointer < 0:
        return f"{idx} is damaged: its last document has {length} tokens at byte {pointer}"
    tokens_end, size = pointer + length * header.itemsize, data.stat().st_size
    if size < tokens_end:
        return f"{data} is truncated: {size} bytes, its index {idx.name} needs {tokens_end}"
    return None


def entries_problem(idx: Path, data: Path) -> str | None:
    """Why the sizes and pointers of `idx` (`index_problem` found none) do not describe the
    documents of `data` back to back from byte 0 to its end, or None: every entry is read, in
    blocks. (The format's readers take bytes past the last document; `data inspect` says so.)"""
    import numpy as np

    header = read_header(idx)
    assert header is not None
    count, itemsize = header.sequences, header.itemsize
    sizes = np.memmap(idx, mode="r", dtype="<i4", offset=HEADER_BYTES, shape=(count,))
    pointers = np.memmap(idx, mode="r", dtype="<i8", offset=HEADER_BYTES + count * 4,
                         shape=(count,))  # fmt: skip
    expected = 0
    for at in range(0, count, BLOCK):
        size, pointer = sizes[at : at + BLOCK].astype(np.int64), pointers[at : at + BLOCK]
        starts = expected + np.concatenate(([0], np.cumsum(size[:-1] * itemsize)))
        bad = np.flatnonzero((size < 0) | (pointer != starts))
        if bad.size:
            i = at + int(bad[0])
            return (
                f"{idx} is damaged: document {i} has {int(sizes[i])} tokens at byte "
                f"{int(pointers[i])}, where the documents before it end at byte {int(starts[bad[0]])}"
            )
        expected = int(starts[-1] + size[-1] * itemsize)
    if data.stat().st_size > expected:
        return (
            f"{data} holds {data.stat().st_size - expected} bytes past the last document of its "
            f"index {idx.name}: they are not one corpus"
        )
    return None


def id_range(prefix: str | Path) -> tuple[int, int] | None:
    """The smallest and largest token id in PREFIX.bin, read in blocks; None when the file is
    empty, larger than SCAN_BYTES, or its index unreadable."""
    import numpy as np

    idx, data = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    header = read_header(idx)
    size = data.stat().st_size
    if header is None or header.code not in DTYPES or not 0 < size <= SCAN_BYTES:
        return None
    name, itemsize = DTYPES[header.code]
    if size < itemsize:
        return None
    tokens = np.memmap(data, mode="r", dtype=name, shape=(size // itemsize,))
    low, high = int(tokens[0]), int(tokens[0])
    for at in range(0, len(tokens), BLOCK * 16):
        part = tokens[at : at + BLOCK * 16]
        low, high = min(low, int(part.min())), max(high, int(part.max()))
    return low, high


def write_index(idx: BinaryIO, sizes: BinaryIO, dtype: str) -> int:
    """Write the .idx for the int32 sequence sizes in `sizes` (read to its end), in blocks:
    constant memory whatever the corpus. Returns the number of documents."""
    import numpy as np

    count = sizes.seek(0, 2) // 4
    itemsize = DTYPES[CODES[dtype]][1]
    idx.write(MAGIC + struct.pack("<QB", VERSION, CODES[dtype]))
    idx.write(struct.pack("<QQ", count, count + 1))
    sizes.seek(0)
    shutil.copyfileobj(sizes, idx)  # the sizes, as they are
    sizes.seek(0)
    offset = 0
    while block := sizes.read(BLOCK * 4):
        lengths = np.frombuffer(block, dtype=np.int32).astype(np.int64) * itemsize
        ends = np.cumsum(lengths) + offset
        idx.write((ends - lengths).tobytes())  # each sequence starts where the last ended
        offset = int(ends[-1])
    for start in range(0, count + 1, BLOCK):
        idx.write(np.arange(start, min(start + BLOCK, count + 1), dtype=np.int64).tobytes())
    return count


class IndexedCorpus:
    """A prepared corpus, memory-mapped: `len(corpus)` documents, `corpus[i]` the token ids of
    document i (a read-only numpy array into PREFIX.bin)."""

    def __init__(self, prefix: str | Path) -> None:
        import numpy as np

        self.idx_path, self.bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        header = read_header(self.idx_path)
        if header is None or header.version != VERSION or header.code not in DTYPES:
            raise ValueError(f"{self.idx_path} is not an index file of the indexed format")
        self.header = header
        self.dtype = np.dtype(DTYPES[header.code][0])
        index = np.memmap(self.idx_path, mode="r", dtype=np.uint8)
        n, docs, at = header.sequences, header.documents, HEADER_BYTES
        self.sizes: np.ndarray[Any, Any] = index[at : at + 4 * n].view(np.int32)
        at += 4 * n
        self.pointers: np.ndarray[Any, Any] = index[at : at + 8 * n].view(np.int64)
        at += 8 * n
        self.document_indices: np.ndarray[Any, Any] = index[at : at + 8 * docs].view(np.int64)
        size = self.bin_path.stat().st_size
        self.tokens = (
            np.memmap(self.bin_path, mode="r", dtype=self.dtype)
            if size
            else np.empty(0, self.dtype)
        )

    def __len__(self) -> int:
        return self.header.sequences

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sizes[i])]

    @property
    def token_count(self) -> int:
        return int(self.sizes.sum(dtype="int64"))
