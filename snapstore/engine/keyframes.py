"""KeyframeCache: the raw bytes of the chunks a delta_chunks store codes new chunks against
(its keyframes), kept in memory from one checkpoint to the next, so that a dense checkpoint
does not read back and decode every base it codes against (docs/floatcodec.md, "Where a
delta's base comes from").

What goes in:
- every chunk of a full float buffer that a checkpoint stores coded on its own (a new
  keyframe: the next checkpoint's base at that place), copied from the staged bytes its
  record was coded from, so the copy is exactly what the record decodes to;
- a base read back because it was not here (read()).
A new keyframe replaces the one its place was offered (that one is no base any more).

Memory is bounded by max_bytes. When it is full, an entry goes only if it was used in
neither the current checkpoint nor the one before (least recently used first); else nothing
new is kept. So a state larger than the cache keeps a fixed part of its keyframes cached
instead of evicting each one just before it is needed again (what plain LRU does to a
cyclic scan).

Entries are keyed by chunk id, the BLAKE3 of their bytes: an entry is right for that id
whatever becomes of the chunk in the store (deleted, moved by compaction), and the writer
offers as bases only chunks of its index view. A cached base is not read again, so damage
to it on disk is found by verify, as for any chunk a checkpoint reuses.

Thread-safe: a checkpoint's two coding threads read at once.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable

from snapstore import _native as native
from snapstore.engine.memory import uninit_bytearray
from snapstore.halves import both, split_point

DEFAULT_MAX_BYTES = 1 << 30     # the open() default of keyframe_cache_bytes
COPY_PARALLEL_BYTES = 1 << 20   # offer_many copies this much or more on two threads


def _copy(jobs: list) -> None:
    for _, dst, data in jobs:
        native.gather(data, [(0, len(data))], dst)


class KeyframeCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict = collections.OrderedDict()  # id -> [bytes, round]
        self._bytes = 0
        self._round = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """The bytes held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, cid: bytes) -> bool:
        return cid in self._entries

    def begin_checkpoint(self) -> None:
        """Called once per checkpoint: entries used since are kept over new ones."""
        with self._lock:
            self._round += 1

    def read(self, chunk_ids: list, read_back: Callable[[list], list]) -> list:
        """The raw bytes of each chunk (a bytes or a view), or None for one read_back could
        not give: those held from here, the others from read_back(their ids) (the store's
        ChunkReader.read_many), which are then kept where there is room."""
        with self._lock:
            out = []
            for cid in chunk_ids:
                entry = self._entries.get(cid)
                if entry is not None:
                    entry[1] = self._round
                    self._entries.move_to_end(cid)
                out.append(None if entry is None else entry[0])
            missing = [i for i, data in enumerate(out) if data is None]
            self.hits += len(chunk_ids) - len(missing)
            self.misses += len(missing)
        if missing:
            for i, data in zip(missing, read_back([chunk_ids[i] for i in missing])):
                out[i] = data
            self.offer_many([(chunk_ids[i], out[i], None) for i in missing
                             if out[i] is not None])
        return out

    def offer(self, cid: bytes, data, replaces: bytes | None = None) -> None:
        """offer_many() of one chunk."""
        self.offer_many([(cid, data, replaces)])

    def offer_many(self, items: list) -> None:
        """Keeps a copy of each (chunk id, data, replaces) item's data (the raw bytes of that
        chunk, a new keyframe) where there is room. `replaces`: the keyframe the chunk takes
        the place of, dropped first; its memory takes the copy when it is as long (no new
        pages to fault in). The copies are made by the C core without the GIL, two threads
        at once from COPY_PARALLEL_BYTES on; an entry is readable once its copy is whole.
        Called between the reads of a checkpoint's batches, never during one (a reader may
        still hold what read() gave it until its batch is coded)."""
        jobs: list = []             # (chunk id, destination, data)
        taking: set = set()
        with self._lock:
            for cid, data, replaces in items:
                size = len(data)
                dst = None
                if replaces is not None and replaces != cid:
                    old = self._entries.pop(replaces, None)
                    if old is not None:
                        self._bytes -= len(old[0])
                        if len(old[0]) == size:
                            dst = old[0]
                if cid in self._entries or cid in taking:
                    continue
                if dst is None:
                    if size > self.max_bytes or not self._room(size):
                        continue
                    dst = uninit_bytearray(size)
                self._bytes += size             # counted now: the copy is made below
                taking.add(cid)
                jobs.append((cid, dst, data))
        if not jobs:
            return
        sizes = [len(data) for _, _, data in jobs]
        if len(jobs) > 1 and sum(sizes) >= COPY_PARALLEL_BYTES:
            at = split_point(sizes)
            both(lambda: _copy(jobs[:at]), lambda: _copy(jobs[at:]))
        else:
            _copy(jobs)
        with self._lock:
            for cid, dst, _ in jobs:
                self._entries[cid] = [dst, self._round]

    def _room(self, size: int) -> bool:
        """Whether size more bytes fit, after dropping entries used in neither this
        checkpoint nor the one before, least recently used first. Under the lock."""
        while self._bytes + size > self.max_bytes and self._entries:
            cid, (data, used) = next(iter(self._entries.items()))
            if used >= self._round - 1:
                return False
            del self._entries[cid]
            self._bytes -= len(data)
        return self._bytes + size <= self.max_bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict:
        return {"keyframe_cache_bytes": self._bytes,
                "keyframe_cache_max_bytes": self.max_bytes,
                "keyframe_cache_hits": self.hits, "keyframe_cache_misses": self.misses}
