"""A .npy file written row block by row block, its length known only at the end: stores too large for memory (the
ColBERT end-to-end token store, MS MARCO's training triples) go to disk as they are made."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np


class NpyRowWriter:
    """A `[rows, width]` .npy file appended to chunk by chunk, its row count known only at `close`. The header is
    written first for the largest row count and overwritten in place at the end: numpy pads a header to a multiple
    of 64 bytes, so any row count gives the same header length (checked), and the rows are never moved (a 150 GB
    store is not copied to prepend a header). Writes go through the file, not a writable memory map, so written
    rows leave the process's memory for the page cache at once."""

    def __init__(self, path: Path, dtype, width: int):
        self.path, self.dtype, self.width, self.rows = Path(path), np.dtype(dtype), int(width), 0
        placeholder = self._header(np.iinfo(np.int64).max)
        self._header_len = len(placeholder)
        self._file = open(self.path, "wb")
        self._file.write(placeholder)

    def _header(self, rows: int) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (rows, self.width)})
        return buf.getvalue()

    def write(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if x.ndim != 2 or x.shape[1] != self.width:
            raise ValueError(f"expected rows of width {self.width}, got shape {x.shape}")
        self._file.write(x.reshape(-1).view(np.uint8))
        self.rows += len(x)

    def close(self) -> np.memmap:
        """Write the true header and return the file memory-mapped, read-only."""
        header = self._header(self.rows)
        if len(header) != self._header_len:  # cannot happen with numpy's 64-byte padding; never write a corrupt file
            raise RuntimeError(f"npy header length changed from {self._header_len} to {len(header)} bytes")
        self._file.seek(0)
        self._file.write(header)
        self._file.close()
        return np.load(self.path, mmap_mode="r")

    def abort(self) -> None:
        self._file.close()
