"""The restore path: resolve a buffer's chain of manifests and copy checked chunk bytes out.

A buffer of checkpoint C is its nearest full manifest up the parent chain with every later
delta written over it, oldest first. Every chunk read is checked against its record checksum
(and the chunk id in the record) before its bytes are used; a mismatch raises CorruptionError
naming the segment and offset, so wrong bytes are never returned.
"""
from __future__ import annotations

import bisect
import collections
from typing import Callable

from snapstore.engine import chunks
from snapstore.engine import extents as ext
from snapstore.errors import CheckpointNotFound, ConcurrentCompactionError, CorruptionError
from snapstore.engine.backends.base import SegmentBackend, SegmentReader
from snapstore.engine.index import IndexView
from snapstore.engine.records import BufferEntry, Commit
from snapstore.engine.wal import segment_version


def buffer_layers(view: IndexView, commit: Commit, name: str) -> list[list]:
    """Extent lists of buffer `name` from its nearest full manifest to `commit`, oldest first."""
    layers = []
    size = find_buffer(commit, name).size
    current = commit
    while True:
        idx = next((i for i, b in enumerate(current.buffers) if b.name == name), None)
        if idx is None or current.buffers[idx].size != size:
            raise CorruptionError(f"checkpoint {current.id} lacks buffer {name!r} of {size} bytes "
                                  f"that checkpoint {commit.id} builds on")
        layers.append(view.extents(current, idx))      # checked: sorted, inside, covering
        if current.buffers[idx].base == "full":
            break
        if current.parent is None or current.parent >= current.id:   # parents are older
            raise CorruptionError(f"checkpoint {current.id} is a delta without a valid parent")
        current = view.named_checkpoint(current.parent, f"checkpoint {current.id} (its parent)")
    layers.reverse()
    return layers


def find_buffer(commit: Commit, name: str) -> BufferEntry:
    for b in commit.buffers:
        if b.name == name:
            return b
    raise CheckpointNotFound(f"checkpoint {commit.id} has no buffer {name!r} "
                             f"(it has {sorted(b.name for b in commit.buffers)})")


class ChunkReader:
    """Reads checked, decoded chunks, keeping the most recent ones (up to CACHE_BYTES): the
    extents of a packed delta chunk, or of a rebased manifest, often revisit a chunk."""

    CACHE_BYTES = 8 << 20

    def __init__(self, backend: SegmentBackend, segments: SegmentReader, view: IndexView) -> None:
        self.backend, self.segments, self.view = backend, segments, view
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cached = 0
        self._versions_checked: set[int] = set()

    def read(self, chunk_id: bytes) -> bytes | memoryview:
        hit = self._cache.get(chunk_id)
        if hit is not None:
            self._cache.move_to_end(chunk_id)
            return hit
        data = self._read(chunk_id)
        self._cache[chunk_id] = data
        self._cached += len(data)
        while self._cached > self.CACHE_BYTES and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old)
        return data

    def _read(self, chunk_id: bytes) -> bytes | memoryview:
        entry = self.view.chunk(chunk_id)
        if entry is None:
            raise CorruptionError(f"index lacks chunk {chunk_id.hex()[:16]}… that a manifest "
                                  "references")
        if entry.segment not in self._versions_checked:
            self._check_version(entry.segment)
        try:
            return chunks.read_chunk(self.segments, entry.segment, entry.offset,
                                     entry.stored_len, chunk_id, entry.raw_len)
        except CorruptionError:
            if self._moved(chunk_id, entry):
                raise ConcurrentCompactionError(
                    f"chunk {chunk_id.hex()[:16]}… was moved by a compaction while this read "
                    "ran; retry the read") from None
            raise

    def _check_version(self, number: int) -> None:
        """FormatError for a segment of a newer version than this library reads (checked once
        per segment and read session). A damaged header is left to the records, each of which
        is checked on its own."""
        try:
            segment_version(self.segments, number)
        except CorruptionError:
            pass
        self._versions_checked.add(number)

    def _moved(self, chunk_id: bytes, entry) -> bool:
        """True when the index, read afresh, no longer places the chunk where this read's
        snapshot did (a compaction ran in between) and the old segment is gone."""
        if entry.segment in self.backend.list():
            return False
        self.view.index.refresh()       # afresh: the index itself may have been replaced
        with self.view.index.read() as fresh:
            now = fresh.chunk(chunk_id)
        return now is None or (now.segment, now.offset) != (entry.segment, entry.offset)


def restore_range(view: IndexView, backend: SegmentBackend, commit: Commit, name: str,
                  out: memoryview, start: int = 0,
                  progress: Callable[[int], None] | None = None) -> None:
    """Writes bytes [start, start + len(out)) of buffer `name` of `commit` into out."""
    end = start + len(out)
    whole = start == 0 and end == find_buffer(commit, name).size
    with backend.open_reader() as segments:
        reader = ChunkReader(backend, segments, view)
        for depth, layer in enumerate(buffer_layers(view, commit, name)):
            extents = layer if whole else ext.clip(layer, start, end)
            if depth == 0:      # the full base writes every byte of out: none is left unfilled
                ext.check_fills(extents, start, end, f"checkpoint {commit.id} buffer {name!r}")
            copy_extents(reader, extents, out, start, progress)


def copy_extents(reader: ChunkReader, extents, out: memoryview, start: int,
                 progress: Callable[[int], None] | None = None) -> None:
    """Copies each extent's chunk bytes to out[offset - start:], checking it lies inside its
    chunk."""
    for off, coff, length, cid in extents:
        data = reader.read(cid)
        if coff + length > len(data):
            raise CorruptionError(f"manifest extent exceeds chunk {cid.hex()[:16]}…")
        out[off - start:off - start + length] = memoryview(data)[coff:coff + length]
        if progress is not None:
            progress(length)


def buffer_manifest(view: IndexView, commit: Commit, name: str) -> list:
    """The one manifest of buffer `name` of `commit`: its layers written over each other, so
    it covers the buffer (checked)."""
    manifest = ext.flatten(buffer_layers(view, commit, name))
    ext.check_fills(manifest, 0, find_buffer(commit, name).size,
                    f"checkpoint {commit.id} buffer {name!r}")
    return manifest


def restore_ranges(view: IndexView, backend: SegmentBackend, commit: Commit, name: str,
                   ranges, out: memoryview) -> None:
    """Writes the byte ranges [(offset, length), ...] of buffer `name` of `commit` back to
    back into out (len(out) == their total; each inside the buffer): one manifest lookup and
    one read session for them all, however many and scattered they are."""
    manifest = buffer_manifest(view, commit, name)
    starts = [e[0] for e in manifest]
    pos = 0
    with backend.open_reader() as segments:
        reader = ChunkReader(backend, segments, view)
        for start, length in ranges:
            if length <= 0:
                continue
            first = max(0, bisect.bisect_right(starts, start) - 1)
            last = bisect.bisect_left(starts, start + length, first)
            piece = ext.clip(manifest[first:last], start, start + length)
            copy_extents(reader, piece, out[pos:pos + length], start)
            pos += length
