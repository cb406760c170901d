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

DEFAULT_MAX_BYTES = 1 << 30     # the open() default of keyframe_cache_bytes


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
                if data is not None:
                    self._keep(chunk_ids[i], data)
        return out

    def offer(self, cid: bytes, data, replaces: bytes | None = None) -> None:
        """Keeps a copy of data (the raw bytes of chunk cid, a new keyframe) where there is
        room. `replaces`: the keyframe cid takes the place of, dropped first; its memory
        takes the copy when it is as long (no new pages to fault in). Called between the
        reads of a checkpoint's batches, never during one (a reader may still hold what
        read() gave it until its batch is coded)."""
        reuse = None
        if replaces is not None and replaces != cid:
            with self._lock:
                old = self._entries.pop(replaces, None)
                if old is not None:
                    self._bytes -= len(old[0])
                    if len(old[0]) == len(data) and cid not in self._entries:
                        reuse = old[0]
                        reuse[:] = data     # under the lock: no read sees it half copied
                        self._entries[cid] = [reuse, self._round]
                        self._bytes += len(reuse)
        if reuse is None:
            self._keep(cid, data)

    def _keep(self, cid: bytes, data) -> None:
        size = len(data)
        if size > self.max_bytes:
            return
        with self._lock:
            if cid in self._entries or not self._room(size):
                return
        copy = bytearray(data)      # outside the lock: a memcpy of up to a chunk
        with self._lock:
            if cid in self._entries or not self._room(size):
                return
            self._entries[cid] = [copy, self._round]
            self._bytes += size

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
