"""Copying checkpoints between stores, as `restic copy` copies snapshots between repositories:
only the chunks the destination lacks are read and sent.

    result = snapstore.copy_checkpoints(src, dst)                 # every checkpoint of src
    result = snapstore.copy_checkpoints(src, dst, ["train@3", "best"])
    result.copied            # {source id: id in dst}, result.skipped likewise

Chunk ids are BLAKE3 content addresses, the same in every store, so a manifest of one store is
valid in any other that holds its chunks. For each source checkpoint, in ascending id order:
its full manifests (a delta chain's layers written over each other) and meta are read from
the source, and dst.import_checkpoint commits them as the next checkpoint of the same stream
in the destination (its parent: the destination stream's head then), asking the source only
for the chunks the destination's index lacks, from the same source index snapshot as the
manifests (Store.with_manifests: a compaction of the source meanwhile never makes it look
damaged; when one moves the chunks while they are read, the import is rolled back and made
again on a new snapshot). A copy is
always stored full, so it never depends on what else was copied; its chunks deduplicate
anyway. It keeps its stream, meta (reserved keys included), tags and creation time; its id is
the destination's own (result.copied maps them), and its reserved meta
"snapstore.copied_from" says where it came from ({"store": the source's path, "id": its id
there}; CheckpointInfo.meta is the original's).

Copying is idempotent, and one destination checkpoint stands for at most one source
checkpoint. A source checkpoint is skipped when the destination already holds the same
checkpoint, i.e. one of the same stream with the same creation time, the same meta (apart
from "snapstore.copied_from") and the same buffers and manifests (names, sizes, extents) -- a
copy made before, a copy of a copy, or the original itself -- that this run has not matched
to an earlier source checkpoint and that comes after the destination checkpoint the run
matched or copied for the previous source checkpoint of the stream. (A compaction that
trimmed the chunks of either side since changes the manifests: such a checkpoint is copied
again.) So two source checkpoints that are the same checkpoint (a savepoint imported twice;
a stream rolled back by importing a savepoint of an older checkpoint, which is then its
newest) get a copy each, and the copies keep each stream's order: the destination
checkpoint standing for the source stream's newest checkpoint copied is the newest of those
standing for the stream's checkpoints copied, so `latest` names the same bytes in both
stores unless the destination's stream has newer checkpoints of its own. Of the
destination checkpoints that may stand for a source checkpoint, it takes (in a store copied
into itself, the checkpoint itself) the oldest copy whose provenance names that source
checkpoint ({"store": store_location(src), "id": its id}), else the oldest that is no copy
of another source checkpoint (by its provenance) that still is the same checkpoint in the
source, selected by this run or not: that one is kept for it (so copying a stream's latest
alone after a rollback copies it, instead of taking the copy of the older checkpoint it
equals). Provenance only orders the choice: a
source opened at another path is matched by content and order, which pairs equal
checkpoints in order. Running the same copy again matches every source checkpoint to the
destination checkpoint it was copied to or matched before, and copies nothing. A checkpoint
copied alone before older ones of its stream is copied again after them when they are
copied (a duplicate, with its tags, so the order holds). Tags added to the source
checkpoint after it was copied are not carried over.

The check and the commit cannot be split by another copy: the destination's stream is listed
again whenever its head moved since it was listed, and the copy is committed only onto the
head the check saw (import_checkpoint's expect_head). When another writer commits to the
stream in between (another copy of the same checkpoint, say), the commit is a CommitConflict,
and the checkpoint is checked and copied again, up to COPY_ATTEMPTS times in all; while
another commit of the stream is only in progress (the head has not moved yet), the copy waits
for it (up to CLAIM_WAIT_SECONDS) and checks again, which costs no attempt. So copies racing
into one destination store each checkpoint once.

Each checkpoint is its own commit: a failure (CommitConflict when other writers committed to
the stream COPY_ATTEMPTS times while it was copied, or kept a commit of it in progress for
CLAIM_WAIT_SECONDS; CorruptionError from damage in the source, StoreIOError...) leaves the
checkpoints copied before it in place, and running the copy again skips them.

Only the public Store API is used, so the same code copies between any two kinds of store;
what differs per destination is its committer's commit_manifests.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from snapstore.engine.format import ORIGIN_META_KEY
from snapstore.engine.meta import original_meta, with_origin
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              InvalidArgumentTypeError, ReadOnlyError, StoreClosedError)
from snapstore.store import CheckpointManifests, Store

__all__ = ["copy_checkpoints", "CopyResult", "store_location"]

COPY_ATTEMPTS = 8       # checks and commits of one checkpoint while other writers move its stream
CLAIM_WAIT_SECONDS = 30.0   # the longest wait for other commits of the stream in progress
CLAIM_POLL_SECONDS = 0.01   # the first pause before looking again (doubling, at most 0.2 s)


@dataclass
class CopyResult:
    """What copy_checkpoints() did.

    Attributes:
        copied: {source id: the new checkpoint's id in the destination}, ascending.
        skipped: {source id: the destination checkpoint that already is that checkpoint},
            each standing for one source checkpoint (see the module doc).
        chunks_sent: chunks read from the source and given to the destination (the ones it
            lacked).
        bytes_sent: their raw bytes.
        bytes_written: what the copies added to the destination's log (their bytes_new:
            compressed chunk records and commit records).
    """
    copied: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    chunks_sent: int = 0
    bytes_sent: int = 0
    bytes_written: int = 0

    def to_json(self) -> dict:
        return {"copied": {str(k): v for k, v in self.copied.items()},
                "skipped": {str(k): v for k, v in self.skipped.items()},
                "chunks_sent": self.chunks_sent, "bytes_sent": self.bytes_sent,
                "bytes_written": self.bytes_written}


def store_location(store: Store) -> str:
    """Where a store lies, for provenance: an absolute path (a URL as it is)."""
    path = os.fsdecode(store.path)
    return path if "://" in path else os.path.abspath(path)


def copy_checkpoints(src: Store, dst: Store, checkpoints: Iterable | None = None, *,
                     progress: Callable[[int, int | None], None] | None = None) -> CopyResult:
    """Copies checkpoints of store src into store dst, sending only the chunks dst lacks (see
    the module doc).

    Args:
        src: the store to copy from (read-only is fine).
        dst: the store to copy into (a writer).
        checkpoints: names as Store.resolve takes them (ids, "STREAM@SEQ", tags, stream
            names for their newest, ...), all resolved before anything is copied; None
            (default): every checkpoint of src (one another writer deletes before its turn
            or while it is copied is skipped: it is not in src any more).
        progress: progress(source id, its id in dst, or None when skipped), after each.
    A source checkpoint the destination already holds is skipped; a destination checkpoint
    stands for at most one source checkpoint, and in each stream only for one after those
    standing for the stream's earlier source checkpoints this run, preferring the copy whose
    provenance names it (module doc): a checkpoint the source holds twice is copied twice,
    the order of each stream is kept, and running the same copy again copies nothing.

    Returns: CopyResult.
    Raises: CheckpointNotFound / AmbiguousCheckpointName (a name, before anything is
        copied; a named checkpoint another writer deletes while it is copied: those copied
        before stay), ReadOnlyError (dst read-only), StoreClosedError, CommitConflict (another
        writer committed to the stream meanwhile: the checkpoints copied before stay),
        CorruptionError (damage in src), ConcurrentCompactionError (compactions of src
        moved a checkpoint's chunks READ_ATTEMPTS times in a row while it was copied: run
        it again), StoreIOError.
    """
    for store, what in ((src, "src"), (dst, "dst")):
        if not isinstance(store, Store):
            raise InvalidArgumentTypeError(f"{what} must be an open Store, got "
                                           f"{type(store).__name__}")
        if store.closed:
            raise StoreClosedError(f"store {store.path} is closed")
    if dst.readonly:
        raise ReadOnlyError(f"store {dst.path} was opened read-only: open the destination "
                            "as a writer to copy into it")
    if progress is not None and not callable(progress):
        raise InvalidArgumentTypeError("progress must be callable or None")
    ids = _selected(src, checkpoints)
    result = CopyResult()
    origin = store_location(src)
    known = _Existing(src, dst, origin)

    def copy_one(m: CheckpointManifests, read_chunks: Callable) -> tuple:
        """((id, stream, seq) of the dst checkpoint that stands for it, None, 0, 0) or (None,
        its new CheckpointInfo, chunks sent, their bytes), on the source snapshot m and
        read_chunks come from."""
        sent = [0, 0]       # counted per attempt: an attempt a compaction cut short sent none

        def counted(wanted: list):
            try:
                for cid, data in read_chunks(wanted):
                    sent[0] += 1
                    sent[1] += len(data)
                    yield cid, data
            except CorruptionError as exc:
                # both stores have segments of the same names: say whose is damaged
                exc.args = (f"the source store {src.path}: {exc.args[0]}",) + exc.args[1:]
                raise
        moves, waited, delay = 0, 0.0, CLAIM_POLL_SECONDS
        while True:
            same, head = known.find(m)
            if same is not None:
                return (same[0], m.info.stream, same[1]), None, 0, 0
            sent[:] = [0, 0]
            try:
                info = dst.import_checkpoint(
                    m.info.stream, m.buffers, counted,
                    with_origin(m.meta, {"store": origin, "id": m.info.id}),
                    created=m.info.created, tags=m.info.tags, expect_head=head)
            except CommitConflict as exc:
                if exc.holder is not None and exc.found == head:
                    # another commit of the stream is in progress (another copy of this
                    # checkpoint, often): wait for it, then check again; not a move
                    if waited >= CLAIM_WAIT_SECONDS:
                        raise
                    pause = delay * (0.5 + random.random() / 2)
                    time.sleep(pause)
                    waited, delay = waited + pause, min(delay * 2, 0.2)
                    continue
                moves += 1
                if moves >= COPY_ATTEMPTS:
                    raise
                continue        # another writer committed to the stream: check again
            return None, info, sent[0], sent[1]

    for source_id in ids:
        try:
            # manifests and chunks from one source snapshot, made again (the import rolled
            # back) when a compaction of the source moves the chunks while they are read
            same, info, chunks_sent, bytes_sent = src.with_manifests(source_id, copy_one)
        except CheckpointNotFound:
            if checkpoints is None:
                continue        # deleted by another writer since the listing: not there now
            raise
        if same is not None:
            known.claim(*same[1:])
            result.skipped[source_id] = same[0]
            if progress is not None:
                progress(source_id, None)
            continue
        known.add(info.stream, info.created, info.id, info.seq)
        result.copied[source_id] = info.id
        result.chunks_sent += chunks_sent
        result.bytes_sent += bytes_sent
        result.bytes_written += info.bytes_new
        if progress is not None:
            progress(source_id, info.id)
    return result


def _selected(src: Store, checkpoints: Iterable | None) -> list[int]:
    """The source ids to copy, ascending, each once."""
    if checkpoints is None:
        return [c.id for c in src.checkpoints()]
    if isinstance(checkpoints, (str, bytes, int)) or not hasattr(checkpoints, "__iter__"):
        raise InvalidArgumentTypeError(f"checkpoints must be a list of checkpoint names or "
                                       f"None, got {type(checkpoints).__name__} "
                                       f"{checkpoints!r}")
    return sorted({src.resolve(name).id for name in checkpoints})


def same_checkpoint(a: CheckpointManifests, b: CheckpointManifests) -> bool:
    """Whether two checkpoints (of any stores) are the same checkpoint: stream, creation time,
    meta apart from its provenance, and buffers with their manifests."""
    return (a.info.stream == b.info.stream and a.info.created == b.info.created
            and original_meta(a.meta) == original_meta(b.meta) and a.buffers == b.buffers)


def copied_from(meta: Any) -> tuple[Any, Any] | None:
    """(store, id) a checkpoint whose meta (as stored) is `meta` was copied from by
    copy_checkpoints, or None: none recorded, or a savepoint import's (its entry names the
    file: an import is a checkpoint of its own, not a copy)."""
    origin = meta.get(ORIGIN_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(origin, dict) or "file" in origin:
        return None
    return origin.get("store"), origin.get("id")


class _Existing:
    """The destination's checkpoints by stream and creation time, to find the one that already
    is a given source checkpoint (see the module doc): each stream listed once, and again when
    its head moved since; and per stream the seq of the destination checkpoint standing for
    the last source checkpoint of the stream this run matched or copied, so a destination
    checkpoint stands for at most one source checkpoint and the order is kept."""

    def __init__(self, src: Store, dst: Store, origin: str) -> None:
        self.src = src
        self.dst = dst
        self.origin = origin
        self.itself = src is dst or store_location(dst) == origin
        # stream -> (its head when listed, {creation time: [(seq, id)], ascending})
        self.by_stream: dict[str, tuple[int | None, dict[float, list[tuple[int, int]]]]] = {}
        self.matched: dict[str, int] = {}       # stream -> seq of its last match this run

    def _stream(self, stream: str) -> tuple[int | None, dict[float, list[tuple[int, int]]]]:
        # the head is read before the listing, so the listing holds it and all before it
        version = self.dst.stream_version(stream)
        head = None if version is None else version[0]
        listed = self.by_stream.get(stream)
        if listed is None or listed[0] != head:
            found: dict[float, list[tuple[int, int]]] = {}
            for c in self.dst.checkpoints(stream):
                found.setdefault(c.created, []).append((c.seq, c.id))
            listed = self.by_stream[stream] = (head, found)
        return listed

    def _kept_for_another(self, origin: tuple[Any, Any] | None,
                          m: CheckpointManifests) -> bool:
        """Whether a destination checkpoint that is the same checkpoint as m, copied from
        `origin`, is the copy of another source checkpoint (selected by this run or not: a
        copy by name after a rollback took the copy of the older checkpoint it equals) that
        still is the same checkpoint in the source (then it stands for that one, not for
        m)."""
        if origin is None or origin[0] != self.origin or not isinstance(origin[1], int) \
                or origin[1] == m.info.id:
            return False
        try:
            theirs = self.src.manifests(origin[1])
        except CheckpointNotFound:          # deleted from the source since
            return False
        return same_checkpoint(theirs, m)

    def find(self, m: CheckpointManifests) -> tuple[tuple[int, int] | None, int | None]:
        """((id, seq) of the destination checkpoint that stands for m, or None; the stream's
        head that answer holds for: a copy committed onto any other head may duplicate
        one)."""
        head, found = self._stream(m.info.stream)
        after = self.matched.get(m.info.stream)
        best, best_rank = None, 3
        for seq, candidate in found.get(m.info.created, ()):
            if after is not None and seq <= after:
                continue                    # stands for an earlier one, or comes before it
            try:
                theirs = self.dst.manifests(candidate)
            except CheckpointNotFound:       # deleted since it was listed
                continue
            if not same_checkpoint(theirs, m):
                continue
            if self.itself and candidate == m.info.id:
                return (candidate, seq), head           # copying a store into itself
            origin = copied_from(theirs.meta)
            if origin == (self.origin, m.info.id):
                rank = 1                                # its own copy
            elif self._kept_for_another(origin, m):
                continue
            else:
                rank = 2
            if rank < best_rank:                        # ascending: the oldest of a rank
                best, best_rank = (candidate, seq), rank
        return best, head

    def claim(self, stream: str, seq: int) -> None:
        """The destination checkpoint seq of stream stands for the source checkpoint being
        copied: later ones may only match checkpoints after it."""
        self.matched[stream] = seq

    def add(self, stream: str, created: float, checkpoint_id: int, seq: int) -> None:
        """checkpoint_id (seq) was just committed onto the head the stream was listed at."""
        _, found = self.by_stream[stream]
        found.setdefault(created, []).append((seq, checkpoint_id))
        self.by_stream[stream] = (checkpoint_id, found)
        self.claim(stream, seq)
