"""KeyframeCache: the raw bytes of the chunks a delta_chunks store codes new chunks against
(its keyframes), kept in memory from one checkpoint to the next, so that a dense checkpoint
does not read back and decode every base it codes against (docs/floatcodec.md, "Where a
delta's base comes from").

What goes in, where there is room:
- every chunk of a full float buffer that a checkpoint stores coded on its own (a new
  keyframe: the next checkpoint's base at that place), copied from the staged bytes its
  record was coded from, so the copy is exactly what the record decodes to; it replaces the
  keyframe its place had (the base it was offered, or the one it renews), in that one's
  memory when as long;
- a base read back because it was not here (read()).

Memory is bounded by max_bytes. When it is full, an entry goes only if its stream has made
two checkpoints since the entry was last used (or the store STALE_ROUNDS checkpoints), least
recently used first; else nothing new is kept. So a state larger than the cache keeps a fixed
share of its keyframes instead of evicting each one just before it is needed again (what
plain LRU does to a cyclic scan), and streams checkpointing in turns keep theirs.

Entries are keyed by chunk id, the BLAKE3 of their bytes: an entry is right for that id
whatever becomes of the chunk in the store (deleted, moved by compaction), and the writer
offers as bases only chunks of its index view. A cached base is not read again, so damage
to it on disk is found by verify, as for any chunk a checkpoint reuses.

Thread-safe: a checkpoint's two coding threads read (and keep what they read back) at once.
The cache is an optimisation: memory it cannot get is memory it does without.
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
STALE_ROUNDS = 1024             # an entry unused for this many checkpoints of the store may go
_MAX_STREAMS = 4096             # streams remembered beyond those with entries


def _stats(bound: int, held: int, hits: int, misses: int) -> dict:
    """The keys Store.stats() reports a keyframe cache under (one place names them)."""
    return {"keyframe_cache_bytes": bound, "keyframe_cache_in_use_bytes": held,
            "keyframe_cache_hits": hits, "keyframe_cache_misses": misses}


def no_cache_stats() -> dict:
    """stats() of a store without a keyframe cache."""
    return _stats(0, 0, 0, 0)


class _Entry:
    __slots__ = ("data", "stream", "stream_round", "round")

    def __init__(self, data, stream, stream_round: int, round_: int) -> None:
        self.data, self.stream, self.stream_round, self.round = \
            data, stream, stream_round, round_


def _copy(jobs: list) -> None:
    for _, dst, data in jobs:
        native.gather(data, [(0, len(data))], dst)


class KeyframeCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict = collections.OrderedDict()  # id -> _Entry
        self._bytes = 0                 # held by entries and by copies being made
        self._copying: dict = {}        # id -> size, of the copies being made (unlocked)
        self._round = 0                 # checkpoints of the store
        self._stream = None             # the stream of the checkpoint being made
        self._stream_rounds: dict = {}  # stream -> its checkpoints
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

    def begin_checkpoint(self, stream=None) -> None:
        """Called once per checkpoint (of `stream`): entries its stream used in this
        checkpoint or its last one are kept over new ones."""
        with self._lock:
            self._round += 1
            self._stream = stream
            self._stream_rounds[stream] = self._stream_rounds.get(stream, 0) + 1
            if len(self._stream_rounds) > _MAX_STREAMS:
                using = {e.stream for e in self._entries.values()} | {stream}
                self._stream_rounds = {s: n for s, n in self._stream_rounds.items()
                                       if s in using}

    def _use(self, cid: bytes, entry: _Entry) -> None:
        """Marks entry used now (under the lock)."""
        entry.stream, entry.round = self._stream, self._round
        entry.stream_round = self._stream_rounds.get(self._stream, 0)
        self._entries.move_to_end(cid)

    def read(self, chunk_ids: list, read_back: Callable[[list], list]) -> list:
        """The raw bytes of each chunk (a bytes or a view), or None for one read_back could
        not give: those held from here, the others from read_back(their ids, each once) (the
        store's ChunkReader.read_many), which are then kept where there is room."""
        with self._lock:
            out = []
            for cid in chunk_ids:
                entry = self._entries.get(cid)
                if entry is not None:
                    self._use(cid, entry)
                out.append(None if entry is None else entry.data)
            missing = list(dict.fromkeys(cid for cid, data in zip(chunk_ids, out)
                                         if data is None))
            self.hits += len(chunk_ids) - sum(data is None for data in out)
            self.misses += len(missing)
        if missing:
            got = dict(zip(missing, read_back(missing)))
            out = [got[cid] if data is None else data for cid, data in zip(chunk_ids, out)]
            self.offer_many([(cid, got[cid], None) for cid in missing
                             if got[cid] is not None])
        return out

    def offer(self, cid: bytes, data, replaces: bytes | None = None) -> None:
        """offer_many() of one chunk."""
        self.offer_many([(cid, data, replaces)])

    def offer_many(self, items: list) -> None:
        """Keeps a copy of each (chunk id, data, replaces) item's data (the raw bytes of that
        chunk) where there is room. `replaces`: the keyframe the chunk takes the place of,
        dropped first; its memory takes the copy when it is as long (no new pages to fault
        in): so an offer with `replaces` must not overlap the reads of a checkpoint's batch
        (a reader may hold what read() gave it until its batch is coded). The copies are made
        by the C core without the GIL, two threads at once from COPY_PARALLEL_BYTES on; an
        entry is readable once its copy is whole."""
        jobs: list = []             # (chunk id, destination, data)
        with self._lock:
            for cid, data, replaces in items:
                size = len(data)
                dst = None
                if replaces is not None and replaces != cid:
                    old = self._entries.pop(replaces, None)
                    if old is not None:
                        self._bytes -= len(old.data)
                        if len(old.data) == size:
                            dst = old.data
                if cid in self._entries or cid in self._copying:
                    continue
                if dst is None:
                    if size > self.max_bytes or not self._room(size):
                        continue
                    try:
                        dst = uninit_bytearray(size)
                    except MemoryError:
                        continue            # as if full: the cache only saves reads
                self._bytes += size         # counted now: the copy is made below
                self._copying[cid] = size
                jobs.append((cid, dst, data))
        if not jobs:
            return
        done = False
        try:
            sizes = [len(data) for _, _, data in jobs]
            if len(jobs) > 1 and sum(sizes) >= COPY_PARALLEL_BYTES:
                at = split_point(sizes)
                both(lambda: _copy(jobs[:at]), lambda: _copy(jobs[at:]))
            else:
                _copy(jobs)
            done = True
        finally:
            with self._lock:
                for cid, dst, _ in jobs:
                    self._copying.pop(cid, None)
                    if done:
                        entry = _Entry(dst, None, 0, 0)
                        self._entries[cid] = entry
                        self._use(cid, entry)
                    else:
                        self._bytes -= len(dst)

    def _room(self, size: int) -> bool:
        """Whether size more bytes fit, after dropping entries whose stream made two
        checkpoints since their last use (or the store STALE_ROUNDS), least recently used
        first. Under the lock."""
        while self._bytes + size > self.max_bytes and self._entries:
            cid, entry = next(iter(self._entries.items()))
            if self._stream_rounds.get(entry.stream, 0) - entry.stream_round < 2 and \
                    self._round - entry.round < STALE_ROUNDS:
                return False
            del self._entries[cid]
            self._bytes -= len(entry.data)
        return self._bytes + size <= self.max_bytes

    def clear(self) -> None:
        """Drops every entry (copies being made still land)."""
        with self._lock:
            self._entries.clear()
            self._bytes = sum(self._copying.values())

    def stats(self) -> dict:
        return _stats(self.max_bytes, self._bytes, self.hits, self.misses)
