"""A .npy file written row block by row block, its length known only at the end.

Stores too large for memory (the ColBERT end-to-end token store, MS MARCO's training triples) go to disk as they are
made.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np


class NpyRowWriter:
    """A `[rows, width]` .npy file appended to chunk by chunk, its row count known only at `close`.

    The header is written first for the largest row count and overwritten in place at the end: numpy pads a header to
    a multiple of 64 bytes, so any row count gives the same header length (checked), and the rows are never moved (a
    150 GB store is not copied to prepend a header). Writes go through the file, not a writable memory map, so
    written rows leave the process's memory for the page cache at once.
    """

    def __init__(self, path: Path, dtype, width: int, readable: bool = False):
        self.path, self.dtype, self.width, self.rows = Path(path), np.dtype(dtype), int(width), 0
        placeholder = self._header(np.iinfo(np.int64).max)
        self._header_len = len(placeholder)
        # readable: the file may be read back through this writer (`reader()`), e.g. after its path was unlinked
        self._file = open(self.path, "w+b" if readable else "wb")
        self._file.write(placeholder)

    def _header(self, rows: int) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf,
            {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (rows, self.width)},
        )
        return buf.getvalue()

    def write(self, x: np.ndarray) -> None:
        """Append the rows `x` ([n, width], cast to the writer's dtype); ValueError for any other shape."""
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

    def reader(self) -> NpyRowReader:
        """Write the true header and hand the open file to a `NpyRowReader` (the writer was made `readable`).

        The rows are readable even when the path no longer exists.
        """
        self._file.seek(0)
        self._file.write(self._header(self.rows))
        self._file.flush()
        self._file.seek(0)
        return NpyRowReader(self._file)

    def abort(self) -> None:
        """Close the file without writing the true header, after a failure: the file is not a valid .npy of the rows.

        Removing it is the caller's job.
        """
        self._file.close()


class NpyRowReader:
    """Rows of a `[rows, width]` .npy file read with `pread`, span by span, into fresh arrays.

    The pages read stay in the page cache, not in this process's resident memory (a memory map of the file would
    count every page touched, 2 MB at a time on kernels that map large folios). The file stays open, so its path may
    be unlinked at once. `memmap()` maps it too (copy-on-write) for a consumer that wants a tensor of every row.
    """

    def __init__(self, path):
        """`path`: a .npy file's path, or a binary file object positioned at its start (kept open, owned)."""
        self._file = path if hasattr(path, "read") else open(path, "rb")
        version = np.lib.format.read_magic(self._file)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(self._file)
        if len(shape) != 2 or fortran:
            self._file.close()
            raise ValueError(f"{path}: expected a C-ordered [rows, width] array, got shape {shape}")
        self.offset, self.shape, self.dtype = self._file.tell(), tuple(shape), np.dtype(dtype)
        self._row_bytes = self.shape[1] * self.dtype.itemsize

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Rows starts[i] : starts[i] + lengths[i] of every span i, one after another: [sum(lengths), width]."""
        out = np.empty((int(np.sum(lengths)), self.shape[1]), dtype=self.dtype)
        raw = memoryview(out.reshape(-1).view(np.uint8))
        fd, pos = self._file.fileno(), 0
        for s, n in zip(np.asarray(starts, dtype=np.int64).tolist(), np.asarray(lengths, dtype=np.int64).tolist()):
            size = n * self._row_bytes
            if size and os.preadv(fd, [raw[pos : pos + size]], self.offset + s * self._row_bytes) != size:
                raise OSError(f"short read from {self._file.name}: rows {s}:{s + n} of {self.shape[0]}")
            pos += size
        return out

    def memmap(self) -> np.ndarray:
        """Return every row as a copy-on-write memory map of the file, `[rows, width]` (changes never reach it)."""
        return np.memmap(self._file, dtype=self.dtype, mode="c", offset=self.offset, shape=self.shape)

    def close(self) -> None:
        """Close the file; no row can be read after it (a memory map taken before stays valid)."""
        self._file.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self._file.close()
