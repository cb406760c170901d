"""Writers uploading the same chunks at the same moment upload them once (docs/design.md,
"S3 stores", "Writers that start together").

A writer deduplicates against the chunks of the commits it can see. Writers that start
together see none of each other's until they commit, so each would upload what they share.
Before it stores a plan of layout.INTENT_MIN_BYTES or more, a writer (durability "remote")
announces it:

  1. it takes the XXH3-64 of each chunk of the plan (a cheap pass: BLAKE3 comes when the
     plan is stored) and creates its intent, INTENTS_DIR<ms>-<writer>-<n>, If-None-Match: *;
  2. after twice the time its PUT took (an intent of an earlier key made at the same moment
     may still be on its way), it lists the intents of the last INTENT_LOOKBACK_SECONDS
     and reads each one ordered
     before its own (key order: time first) that another writer made; a chunk of the plan
     that one of them holds is the earliest such intent's to upload;
  3. for each intent it defers to, it reads the intent's outcome until it is there or a
     deadline passes (wait_seconds: INTENT_WAIT_SECONDS plus that plan's bytes, or four
     times the bytes it shares with this one if fewer, at INTENT_WAIT_RATE; never past
     what the caller allows). An outcome is the NEW_CHUNK table of every chunk
     that writer's commit stored or reused, written once its uploads landed (empty when it
     gave up). The entries of an outcome whose records lie within segments that exist in
     the bucket (a HEAD per segment) become chunks the plan may reuse (ChunkSink.known);
  4. the plan is stored as always: what the outcomes located is reused, the rest stored;
     once the commit's uploads landed, the writer writes the outcomes of its own intents.

Why it is safe: it decides only which chunks a commit reuses, and a commit reuses only chunks
an outcome locates within a segment that exists; a chunk's id is the BLAKE3 of its bytes,
and reads check a record's id. Such a segment may belong to a commit not made (yet, or
ever): gc keeps it through its grace (gc.py), the commit's W1 check (gcguard.py) has it
planned again without it when gc marked it, and once the commit lands the segment is
reachable. Waits go only to intents ordered before the waiter's (never to its own), so they
never form a cycle, and each ends at its deadline. Writers that miss each other (each listed
before the other's intent landed) both upload, as before this module. An intent or outcome
that is damaged, or gone, is passed over: nothing waits for it.
"""
from __future__ import annotations

import struct
import time
from typing import Callable

import xxhash

from snapstore.engine import format as fmt
from snapstore.engine.writer import BufferPlan
from snapstore.errors import CorruptionError, FormatError, RemoteError, SnapstoreError
from snapstore.remote import envelope, layout
from snapstore.remote.s3client import NotFound, PreconditionFailed, S3Client

_POLL_MAX_SECONDS = 0.5


def plan_fingerprints(plan: BufferPlan) -> list[int]:
    """The XXH3-64 of each chunk of the plan (its pieces of plan.view, or its bytes in
    plan.staged), in order."""
    out = []
    at = 0
    for pieces in plan.chunks:
        h = xxhash.xxh3_64()
        for off, n in pieces:
            if plan.staged is not None:
                h.update(plan.staged[at:at + n])
                at += n
            else:
                h.update(plan.view[off:off + n])
        out.append(h.intdigest())
    return out


def encode_intent(nbytes: int, fingerprints: list[int]) -> bytes:
    body = layout.INTENT_HEADER.pack(nbytes, len(fingerprints)) + \
        struct.pack(f"<{len(fingerprints)}Q", *fingerprints)
    return envelope.seal(layout.INTENT_MAGIC, layout.INTENT_VERSION, len(body), [body])


def decode_intent(data: bytes, key: str) -> tuple[int, frozenset]:
    """(the plan's bytes, its chunks' fingerprints). Raises CorruptionError, FormatError."""
    begin, length, end = envelope.unseal(data, key, "intent", "an intent",
                                         layout.INTENT_MAGIC, layout.INTENT_VERSION)
    head = layout.INTENT_HEADER.size
    if length != end - begin or length < head:
        raise envelope.damaged("intent", key, f"its body is {end - begin} bytes, not {length}")
    nbytes, count = layout.INTENT_HEADER.unpack_from(data, begin)
    if length != head + count * layout.INTENT_FINGERPRINT.size:
        raise envelope.damaged("intent", key, f"{count} fingerprints do not fill {length} bytes")
    return nbytes, frozenset(struct.unpack_from(f"<{count}Q", data, begin + head))


def encode_outcome(table: bytes) -> bytes:
    return envelope.seal(layout.INTENT_OUTCOME_MAGIC, layout.INTENT_VERSION, len(table),
                         [table])


def decode_outcome(data: bytes, key: str) -> bytes:
    """The NEW_CHUNK table of an outcome. Raises CorruptionError, FormatError."""
    begin, length, end = envelope.unseal(data, key, "intent outcome", "an intent outcome",
                                         layout.INTENT_OUTCOME_MAGIC, layout.INTENT_VERSION)
    if length != end - begin or length % fmt.NEW_CHUNK.size:
        raise envelope.damaged("intent outcome", key,
                               f"a table of {end - begin} bytes (the header says {length})")
    return data[begin:end]


def writer_of(key: str) -> str:
    """The writer an intent's key names ('' when it names none)."""
    parts = key[len(layout.INTENTS_DIR) + layout.INTENT_TIME_DIGITS + 1:].split("-")
    return parts[0] if len(parts) == 2 else ""


def wait_seconds(their_bytes: float, shared_bytes: float) -> float:
    """How long a writer waits for the outcome of an intent of their_bytes that is to upload
    shared_bytes of its plan: INTENT_WAIT_SECONDS plus the time their upload takes at
    INTENT_WAIT_RATE, but no longer than four times what the shared bytes take (a large
    intent sharing little with the plan is not worth waiting for in full)."""
    return layout.INTENT_WAIT_SECONDS + min(their_bytes, 4 * shared_bytes) / \
        layout.INTENT_WAIT_RATE


def earliest_holders(mine, earlier: list) -> list[tuple[str, tuple, int]]:
    """[(key, intent, how many of `mine` it is to upload)] for the intents `earlier` [(key,
    (bytes, fingerprints))] in key order: each fingerprint of `mine` goes to the first
    intent holding it; intents given none are left out."""
    left = set(mine)
    out = []
    for key, theirs in earlier:
        shared = left & theirs[1]
        if shared:
            left -= shared
            out.append((key, theirs, len(shared)))
    return out


class IntentBoard:
    """One writer's intents (see the module docstring): begin() at a commit's start,
    announce(plan) before each plan is stored, finish(table) once the commit's uploads
    landed, abandon() when it failed before. Intents read are remembered (they never
    change) while they are within the lookback; so are the sizes of segments seen."""

    def __init__(self, client: S3Client, writer_id: str, serial: Callable[[], int], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.writer_id, self.serial, self.clock = client, writer_id, serial, clock
        self._mine: list[str] = []
        self._read: dict[str, tuple[int, frozenset] | None] = {}
        self._sizes: dict[int, int | None] = {}

    def begin(self) -> None:
        self._mine = []

    def announce(self, plan: BufferPlan, until: float) -> dict[bytes, tuple]:
        """Steps 1-3 for one plan: {chunk id: (segment, offset, stored length, raw length,
        codec)} of the chunks other writers' outcomes located (only chunks of intents
        holding chunks of this plan: it may name more than the plan's). Waits at most until
        `until` (time.monotonic()). Raises RemoteError."""
        if plan.nbytes < layout.INTENT_MIN_BYTES:
            return {}
        mine = set(plan_fingerprints(plan))
        millis = int(self.clock() * 1000)
        key = layout.intent_key(millis, self.writer_id, self.serial())
        put_at = time.monotonic()
        try:
            self.client.put(key, encode_intent(plan.nbytes, sorted(mine)), if_none_match=True)
        except PreconditionFailed:      # a key of this writer's own, taken: cannot happen
            return {}
        self._mine.append(key)
        # A writer that took an earlier key at about the same moment may not have its intent
        # in the bucket yet: it would upload what this one then uploads too. Its PUT takes
        # about as long as this one's did, so the listing waits for that once more.
        took = time.monotonic() - put_at
        time.sleep(min(max(2 * took, layout.INTENT_SETTLE_MIN_SECONDS),
                       layout.INTENT_SETTLE_MAX_SECONDS))
        owners = self._owners(key, millis, mine)
        started = time.monotonic()
        found: dict[bytes, tuple] = {}
        chunk_bytes = plan.nbytes / max(1, len(plan.chunks))
        for owner, (nbytes, deferred) in owners.items():
            found.update(self._await(owner, min(until, started + wait_seconds(
                nbytes, deferred * chunk_bytes))))
        return found

    def _owners(self, key: str, millis: int, mine: set) -> dict[str, tuple[int, int]]:
        """{intent key: (its plan's bytes, how many chunks of `mine` it is to upload)}: the
        other writers' intents ordered before `key` holding chunks of `mine`, each chunk
        going to the earliest."""
        since = millis - int(layout.INTENT_LOOKBACK_SECONDS * 1000)
        for old in [k for k in self._read if (layout.intent_millis(k) or 0) < since]:
            del self._read[old]
        earlier = []
        first = layout.INTENTS_DIR + f"{since:0{layout.INTENT_TIME_DIGITS}d}"
        for obj in self.client.list(layout.INTENTS_DIR, start_after=first):
            if obj.key >= key:
                break
            if obj.key.endswith(layout.INTENT_OUTCOME_SUFFIX) or \
                    writer_of(obj.key) in ("", self.writer_id):
                continue
            theirs = self._intent(obj.key)
            if theirs is not None:
                earlier.append((obj.key, theirs))
        return {k: (theirs[0], n) for k, theirs, n in earliest_holders(mine, earlier)}

    def _intent(self, key: str) -> tuple[int, frozenset] | None:
        if key not in self._read:
            try:
                data, _ = self.client.get(key)
                self._read[key] = decode_intent(data, key)
            except NotFound:
                self._read[key] = None          # gone (gc): nothing to wait for
            except (CorruptionError, FormatError):
                self._read[key] = None          # damaged: passed over
        return self._read[key]

    def _await(self, key: str, deadline: float) -> dict[bytes, tuple]:
        """The usable entries of the outcome of intent `key`, read until it is there or the
        deadline passes ({} then, or when it is damaged)."""
        outcome = key + layout.INTENT_OUTCOME_SUFFIX
        pause = layout.INTENT_POLL_SECONDS
        while True:
            try:
                data, _ = self.client.get(outcome)
                break
            except NotFound:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {}
                time.sleep(min(pause, left))
                pause = min(pause * 1.5, _POLL_MAX_SECONDS)
        try:
            table = decode_outcome(data, outcome)
        except (CorruptionError, FormatError):
            return {}
        return self._usable(table)

    def _usable(self, table: bytes) -> dict[bytes, tuple]:
        """The entries of a NEW_CHUNK table whose records lie within segments that exist."""
        out = {}
        for cid, seg, off, stored, raw, codec in fmt.NEW_CHUNK.iter_unpack(table):
            if seg not in self._sizes:
                info = self.client.head(layout.segment_key(seg))
                self._sizes[seg] = None if info is None else info.size
            size = self._sizes[seg]
            if size is not None and off + fmt.RECORD_HEADER.size + stored <= size:
                out[cid] = (seg, off, stored, raw, codec)
        return out

    def finish(self, table: bytes) -> None:
        """Step 4's end: the outcome of each intent of this commit, `table` (the NEW_CHUNK
        entries of every chunk the commit stored or reused), once its uploads landed.
        Raises RemoteError."""
        for key in self._mine:
            self.client.put(key + layout.INTENT_OUTCOME_SUFFIX, encode_outcome(table))
        self._mine = []

    def abandon(self, why: BaseException | None = None) -> None:
        """The commit failed before its uploads landed (`why`): empty outcomes, so that
        nobody waits for it. Best effort, since whoever waits stops at its deadline anyway:
        none when the bucket is what failed (RemoteError), whose retries would only add
        their timeout to the failure's."""
        if isinstance(why, RemoteError):
            self._mine = []
            return
        for key in self._mine:
            try:
                self.client.put(key + layout.INTENT_OUTCOME_SUFFIX, encode_outcome(b""))
            except SnapstoreError:      # the failure being raised matters more
                break
        self._mine = []
