"""Parquet as a text corpus (what ``datasets`` exports): one document per row of a string column,
read a batch of rows at a time; the reader :mod:`attn_core.text.corpus` uses for ``.parquet`` (which
hands it its error class and how a document is cut into pieces: this module imports nothing of
attn_core)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def parquet_pieces(
    fh, path: Path, field: str, seen, split, error: type[Exception], block: int
) -> Iterator[tuple[str, bool, int]]:
    """One document per row: the string column ``field`` (null cells skipped), read a batch of
    rows at a time. The whole file is hashed first (Parquet is read out of order)."""
    while data := fh.read(block):
        seen(data)
    fh.seek(0)
    try:
        pf = pq.ParquetFile(fh)
        schema = pf.schema_arrow
    except Exception as e:  # pyarrow raises ArrowInvalid and several others
        raise error(f"{path} is not a readable Parquet file ({_first(e)})") from None
    if field not in schema.names:
        columns = ", ".join(repr(n) for n in schema.names[:8]) or "none"
        raise error(f"{path} has no column {field!r} (its columns: {columns}); name the text with --text-field")
    if schema.names.count(field) > 1:
        raise error(
            f"{path} has {schema.names.count(field)} columns named {field!r}; which one holds the text is unclear"
        )
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise error(f"{path}: column {field!r} holds {kind}, not text")
    size = os.fstat(fh.fileno()).st_size
    groups = max(pf.num_row_groups, 1)
    try:
        for i in range(pf.num_row_groups):
            first_batch = True
            for batch in pf.iter_batches(batch_size=256, columns=[field], row_groups=[i]):
                read = size // groups if first_batch else 0
                first_batch = False
                for value in batch.column(0).to_pylist():
                    if value is None:
                        continue
                    for piece, last in split(value):
                        yield piece, last, read
                        read = 0
    except Exception as e:  # pyarrow's errors, OSError, text that is not UTF-8 in a string column
        raise error(f"{path} could not be read to the end ({_first(e)})") from None


def _first(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:160]
