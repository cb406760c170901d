"""Verification: prove the index consistent with itself and with the log, and (deep) that every
stored byte still matches its checksum and its chunk id.

Shallow: checkpoints, chains, manifests, streams and exact reference counts; every chunk
record the index points at has a valid header and checksum. Deep: additionally every record
of every segment (live or not) is read and checked, and every chunk is decompressed and
re-hashed with BLAKE3, and every index entry is matched with the record at its offset (the
chunk id, lengths, codec and delta base it names; several entries at one offset are each
checked). Format 5 delta chunks: a chunk's reference count also counts the delta chunks coded
against it (edges), a delta chunk's base must have an entry and lie exactly one level less
deep (a plain chunk ends the chain), and the deep check decodes a delta chunk over its base
(read through the index, checked the same way) before it re-hashes it. Each
problem lists the checkpoints whose restore it would break (including later checkpoints that
build on them through delta chains, and the users of delta chunks coded against a chunk).
When a problem lies in the index (INDEX_KINDS), the report
carries a "hint" naming `snapstore repair`, which rebuilds the index from the log.
"""
from __future__ import annotations

import bisect
import time
from collections import Counter, OrderedDict, defaultdict

import blake3

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import planes
from snapstore.errors import CorruptionError, DamagedRecord, SnapstoreError
from snapstore.engine.backends.base import SegmentBackend, segment_name
from snapstore.engine.chunks import (StoredChunk, decode_chunk, decode_delta, delta_base,
                                     read_stored_chunk, stored_chunk)
from snapstore.engine.index import REPAIR_HINT, Index
from snapstore.engine.wal import (damaged_record, log_of, logs_of, next_valid_record,
                                  parse_record_header, read_record, segment_version,
                                  writeback_hole, zeroed_segment_header)

# Problems of the index itself (the log may be intact): `snapstore repair` rebuilds it.
INDEX_KINDS = frozenset({"missing_manifest", "missing_parent", "bad_extent", "missing_chunk",
                         "incomplete_manifest", "broken_chain", "stream", "refcount",
                         "lost_record", "index_mismatch", "missing_segment",
                         "unreadable_index",
                         # the log lost records the index applied: out of step with it
                         "lost_tail"})


class ProblemReport:
    """The problems a check finds (verify, repair), each a dict: kind, message, the
    checkpoints whose restore it breaks, segment and offset."""

    def __init__(self) -> None:
        self.problems: list[dict] = []

    def add(self, kind: str, message: str, checkpoints=(), segment: int | None = None,
            offset: int | None = None) -> None:
        self.problems.append({"kind": kind, "message": message,
                              "checkpoints": sorted(set(checkpoints)),
                              "segment": segment_name(segment) if segment is not None else None,
                              "offset": offset})


def children_of(commits: dict) -> dict[int, list]:
    """{checkpoint id: the ids of its children} of commits {id: Commit} (what dependents()
    walks)."""
    children: dict[int, list] = defaultdict(list)
    for i, c in commits.items():
        if c.parent is not None:
            children[c.parent].append(i)
    return children


def dependents(commits: dict, children: dict, start) -> set[int]:
    """Checkpoint ids whose restore of a buffer reads a manifest in `start` ((id, buffer name)
    pairs): those checkpoints, and every later one whose delta chain of that buffer passes
    through them."""
    seen, todo = set(), list(start)
    while todo:
        pair = todo.pop()
        if pair in seen:
            continue
        seen.add(pair)
        cid, name = pair
        for child in children.get(cid, ()):
            for b in commits[child].buffers:
                if b.name == name and b.base == "delta":
                    todo.append((child, name))
    return {cid for cid, _ in seen}


def _chunk_users(cid: bytes, users: dict, deltas_of: dict) -> set:
    """The (checkpoint, buffer name) pairs that read chunk cid: its own users, and those of
    every delta chunk coded against it, at any depth (a delta chunk decodes only over its
    base, so damage to a base breaks them too)."""
    found: set = set()
    seen, todo = set(), [cid]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        found |= users.get(c, set())
        todo.extend(deltas_of.get(c, ()))
    return found


def verify(index: Index, backend: SegmentBackend, *, deep: bool = False) -> dict:
    """Checks the store (module docstring). The caller holds the maintenance lock (shared),
    so no compaction removes segments or replaces the index while this runs."""
    started = time.perf_counter()
    report = ProblemReport()
    # An Index notices an index another process replaced (compaction's shrink) only
    # RECHECK_SECONDS later; the replaced one may point into segments removed since. Under
    # the maintenance lock the current index stays current: read that one.
    index.refresh()
    try:
        with index.read() as r:
            commits = {i: r.checkpoint(i) for i in r.checkpoint_ids()}
            chunks = dict(r.chunks())
            streams = r.streams()
            applied = r.logs()
            stream_members = {s: r.checkpoint_ids(s) for s in streams}
            manifests = {}
            missing = []
            for i, c in commits.items():
                for bi in range(len(c.buffers)):
                    try:
                        manifests[(i, bi)] = ext.unpack(r.manifest(i, bi))
                    except CorruptionError as exc:
                        missing.append((i, c.buffers[bi].name, str(exc)))
    except CorruptionError as exc:
        # the index cannot even be listed (a damaged key or record of its tables): nothing
        # else can be checked against it; a report, not an exception, and the way out
        report.add("unreadable_index", str(exc))
        return _result(report, deep, started, checkpoints=0, chunks=0, segments=0,
                       bytes_checked=0)
    children = children_of(commits)
    users: dict[bytes, set] = defaultdict(set)     # chunk id -> {(checkpoint, buffer name)}
    refs: Counter = Counter()
    # format 5: base chunk id -> the delta chunks whose entries name it (each an edge, counted
    # in the base's reference count)
    deltas_of: dict[bytes, list] = defaultdict(list)
    for cid, entry in chunks.items():
        if entry.base is not None:
            deltas_of[entry.base].append(cid)

    def affected(cid: bytes) -> set[int]:
        """The checkpoints whose restore reads chunk cid (directly or as a delta's base)."""
        return dependents(commits, children, _chunk_users(cid, users, deltas_of))

    def reach(i: int, name: str | None = None) -> set[int]:
        """Checkpoint i (its buffer `name`, or all) and the later ones that build on it."""
        names = [name] if name is not None else [b.name for b in commits[i].buffers]
        return dependents(commits, children, {(i, n) for n in names}) | {i}

    for i, name, message in missing:
        report.add("missing_manifest", message, reach(i, name))

    # -- checkpoints, chains and manifests
    for i, c in commits.items():
        parent = commits.get(c.parent) if c.parent is not None else None
        if c.parent is not None and parent is None:
            report.add("missing_parent", f"checkpoint {i} names missing parent {c.parent}",
                       reach(i))
        for bi, b in enumerate(c.buffers):
            extents = manifests.get((i, bi))
            if extents is None:
                continue
            end = 0
            for off, coff, length, cid in extents:
                if length <= 0 or off < end or off + length > b.size:
                    report.add("bad_extent", f"checkpoint {i} buffer {b.name!r}: extent "
                               f"{off}+{length} is out of order or out of bounds", reach(i, b.name))
                end = max(end, off + length)
                refs[cid] += 1
                users[cid].add((i, b.name))
                entry = chunks.get(cid)
                if entry is None:
                    report.add("missing_chunk", f"checkpoint {i} buffer {b.name!r} references "
                               f"chunk {cid.hex()[:16]}… which the index lacks", reach(i, b.name))
                elif coff + length > entry.raw_len:
                    report.add("bad_extent", f"checkpoint {i} buffer {b.name!r}: extent reaches "
                               f"past the end of chunk {cid.hex()[:16]}…", reach(i, b.name))
            if b.base == "full" and ext.covered_bytes(extents) != b.size:
                report.add("incomplete_manifest", f"checkpoint {i} buffer {b.name!r}: full "
                           f"manifest covers {ext.covered_bytes(extents)} of {b.size} bytes", reach(i, b.name))
            if b.base == "delta":
                pb = next((p for p in parent.buffers if p.name == b.name), None) if parent else None
                if pb is None or pb.size != b.size:
                    report.add("broken_chain", f"checkpoint {i} buffer {b.name!r} is a delta "
                               "without a matching buffer in its parent", reach(i, b.name))
                elif pb.depth + 1 != b.depth:
                    report.add("broken_chain", f"checkpoint {i} buffer {b.name!r} has depth "
                               f"{b.depth}, its parent's is {pb.depth}", reach(i, b.name))
        if c.stream not in streams or i not in stream_members.get(c.stream, ()):
            report.add("stream", f"checkpoint {i} is not listed in its stream {c.stream!r}", [i])
    for s, head in streams.items():
        if head not in commits or commits[head].stream != s:
            report.add("stream", f"stream {s!r} names head {head}, which is not one of its "
                       "checkpoints")
    _check_refs_and_bases(chunks, refs, deltas_of, report, affected)

    # -- segments: each log still holds what the index applied of it (a writer's open
    # refuses the store otherwise), and the records the index points at
    present = set(backend.list())
    for log, (seg, off) in sorted(applied.items()):
        size = _size_or_none(backend, seg) if seg in present else None
        if size is None or size < off:
            report.add("lost_tail", f"the index has applied log {log} up to "
                       f"{segment_name(seg)}:{off}, but " +
                       ("that segment is missing" if size is None else f"it ends at {size}") +
                       ": acknowledged records were lost", segment=seg, offset=off)
    by_segment: dict[int, list] = defaultdict(list)
    for cid, e in chunks.items():
        by_segment[e.segment].append((e.offset, cid, e))
    for seg in sorted(by_segment):
        if seg not in present:
            report.add("missing_segment", "segment file is missing",
                       set().union(*(affected(cid) for _, cid, _ in by_segment[seg])), seg)
    bytes_checked = 0
    if not deep:
        found: dict[bytes, tuple] = {}      # delta chunk id -> (its record's base, depth)
        for seg in sorted(set(by_segment) & present):
            with backend.open_reader() as segments:
                for off, cid, e in sorted(by_segment[seg], key=lambda t: t[0]):
                    try:
                        chunk = read_stored_chunk(segments, seg, off, e.stored_len, cid)
                        base, depth = _record_base(chunk)
                        if base is not None:
                            found[cid] = (base, depth)
                        bytes_checked += fmt.RECORD_HEADER.size + e.stored_len
                    except CorruptionError as exc:
                        report.add("damaged_chunk", str(exc), affected(cid), seg, off)
                        continue
                    mismatch = _entry_mismatch(chunk.record, cid, e)
                    if mismatch:
                        report.add("index_mismatch", mismatch, affected(cid), seg, off)
        _check_delta_depths(chunks, found, report, affected)
    else:
        with backend.open_reader() as base_reader:
            bytes_checked = _deep_segments(backend, present, applied, by_segment,
                                           _Bases(base_reader, chunks), report, affected)

    return _result(report, deep, started, checkpoints=len(commits), chunks=len(chunks),
                   segments=len(present), bytes_checked=bytes_checked)


def _deep_segments(backend: SegmentBackend, present: set, applied: dict, by_segment: dict,
                   bases: "_Bases", report: ProblemReport, affected) -> int:
    """The deep check of every segment in `present` (verify's docstring): returns the bytes
    read. bases: where delta chunks' bases are read from."""
    last_of_log = {max(ns) for ns in logs_of(present).values()}
    bytes_checked = 0
    for seg in sorted(present):
        known = defaultdict(list)       # offset -> [(chunk id, entry)]: all of them
        for off, cid, e in by_segment.get(seg, []):
            known[off].append((cid, e))
        # a log's last segment may end in a torn tail or a record being appended, but
        # only past what the index applied of the log (records before it are committed)
        tail = None
        if seg in last_of_log:
            done = applied.get(log_of(seg))
            tail = (done[1] if done is not None and done[0] == seg
                    else fmt.SEGMENT_HEADER.size if done is None or done[0] < seg
                    else None)
        try:
            size = backend.size(seg)
        except FileNotFoundError:
            done = applied.get(log_of(seg))
            if not known and (done is None or done[0] < seg):
                # wholly past what the index applied of its log and named by no entry:
                # such segments come and go while writers run (a writer rolls back the
                # segments of a commit that lost its race; a recovery removes a torn
                # one), so one gone since the listing is no problem
                continue
            report.add("missing_segment", "segment file is missing", segment=seg)
            continue
        try:
            with backend.open_reader() as segments:
                bytes_checked += _deep_scan(segments, size, seg, known, report, affected,
                                            tail=tail, bases=bases)
        except OSError as exc:
            if isinstance(exc, SnapstoreError):
                raise
            # a read error the scan could not step over (a bad sector): what is left of
            # the segment is unchecked, and every checkpoint using it is reported
            report.add("unreadable_segment", f"reading the segment failed: "
                       f"{exc.strerror or exc}",
                       set().union(*(affected(cid) for cid, _ in
                                     (x for xs in known.values() for x in xs))), seg)
    return bytes_checked


def _check_refs_and_bases(chunks: dict, refs: Counter, deltas_of: dict,
                          report: ProblemReport, affected) -> None:
    """Each chunk's reference count must be the extents naming it plus the delta chunks
    coded against it (their edges keep a base alive as long as they are); a delta chunk's
    base must have an entry (else nothing that reads the delta chunk restores)."""
    for cid, entry in chunks.items():
        edges = len(deltas_of.get(cid, ()))
        if entry.refs != refs.get(cid, 0) + edges:
            report.add("refcount", f"chunk {cid.hex()[:16]}… has reference count {entry.refs}, "
                       f"manifests reference it {refs.get(cid, 0)} times and delta chunks "
                       f"{edges} times", affected(cid), entry.segment, entry.offset)
        if entry.base is not None and entry.base not in chunks:
            report.add("missing_chunk", f"delta chunk {cid.hex()[:16]}… is coded against "
                       f"chunk {entry.base.hex()[:16]}…, which the index lacks", affected(cid))


def _record_base(chunk: StoredChunk) -> tuple[bytes | None, int]:
    """(base chunk id, depth) a chunk record names: (None, 0) for a plain chunk. Raises
    DamagedRecord for a delta chunk whose delta header is damaged."""
    if chunk.record.codec != fmt.CODEC_DELTA_PLANES:
        return None, 0
    return delta_base(chunk)


def _check_delta_depths(chunks: dict, found: dict, report: ProblemReport, affected) -> None:
    """Shallow check of the delta chains the records describe (found: delta chunk id ->
    (base, depth) its record names): a restore decodes a delta chunk only over a base of its
    length exactly one level less deep (0: a plain chunk), as ChunkReader checks. A base the
    index lacks, or a delta base whose record did not read, is reported already; a plain
    base is taken at its entry's word (an entry unlike its record is reported too)."""
    for cid, (base, depth) in found.items():
        be = chunks.get(base)
        if be is None or (be.base is not None and base not in found):
            continue
        e, base_depth = chunks[cid], found[base][1] if base in found else 0
        if base_depth != depth - 1 or be.raw_len != e.raw_len:
            report.add("damaged_chunk", f"delta chunk {cid.hex()[:16]}… ({e.raw_len} bytes, "
                       f"depth {depth}) is coded against chunk {base.hex()[:16]}… "
                       f"({be.raw_len} bytes, depth {base_depth}): it cannot be decoded",
                       affected(cid), e.segment, e.offset)


def _size_or_none(backend: SegmentBackend, seg: int) -> int | None:
    try:
        return backend.size(seg)
    except FileNotFoundError:
        return None


def _result(report: ProblemReport, deep: bool, started: float, **counts) -> dict:
    problems = report.problems
    out = {"ok": not problems, "deep": deep, "problems": problems, **counts,
           "seconds": time.perf_counter() - started}
    if any(p["kind"] in INDEX_KINDS for p in problems):
        out["hint"] = f"the index is damaged or out of step with the log: {REPAIR_HINT}"
    return out


def _entry_mismatch(record, cid: bytes, e) -> str | None:
    """What an index entry gets wrong about the valid record at its offset, or None."""
    if record.rtype != fmt.REC_CHUNK:
        return "the index places a chunk where the log holds another kind of record"
    chunk = stored_chunk(record)
    if chunk.chunk_id != cid:
        return (f"the index places chunk {cid.hex()[:16]}… where the log holds chunk "
                f"{chunk.chunk_id.hex()[:16]}…")
    if record.length != e.stored_len or chunk.raw_len != e.raw_len or record.codec != e.codec:
        return (f"the index entry of chunk {cid.hex()[:16]}… (stored {e.stored_len}, raw "
                f"{e.raw_len}, codec {e.codec}) does not match its record (stored "
                f"{record.length}, raw {chunk.raw_len}, codec {record.codec})")
    try:
        base = _record_base(chunk)[0]
    except DamagedRecord as exc:
        return f"the record of chunk {cid.hex()[:16]}… is damaged: {exc.reason}"
    if base != e.base:
        return (f"the index entry of delta chunk {cid.hex()[:16]}… names base "
                f"{_short(e.base)} where its record names {_short(base)}")
    return None


def _short(cid: bytes | None) -> str:
    return "none" if cid is None else f"{cid.hex()[:16]}…"


def _deep_scan(segments, size: int, seg: int, known: dict, report: ProblemReport, affected,
               tail: int | None = None, bases: "_Bases | None" = None) -> int:
    """Checks every record of one segment. After a damaged record it resumes where the damaged
    record's length says the next one starts only if no record the index knows of lies in
    between and a valid header is there; otherwise at the next record the index knows of (a
    flipped length field must not hide the records after it). In the last segment of a log,
    invalid bytes from offset `tail` on (past the log's applied position) after which no valid
    record follows, or that are a writeback hole (wal.writeback_hole: what follows it was
    never acknowledged either), are a crash's torn tail, or the record its writer is
    appending right now: not a problem (recovery cuts a torn tail); so is a log's last
    segment, wholly past that position, shorter than its header or with a header that reads
    as zeros (created, its header being written, or torn by a crash: recovery removes it).
    bases: where the bases of delta chunks are read (without it, a delta chunk's bytes are
    not re-hashed). A delta chunk the index knows whose base is
    damaged is reported too (damaged_chunk, at the delta chunk's record).
    Returns bytes read."""
    starts = sorted(known)
    seen = set()
    types, codecs = fmt.RECORD_TYPES, fmt.CODECS
    rotations = range(fmt.PLANES_ROTATION + 1)
    try:
        version = segment_version(segments, seg)
        types, codecs = fmt.SEGMENT_RECORD_TYPES[version], fmt.SEGMENT_CODECS[version]
        rotations = fmt.SEGMENT_PLANE_ROTATIONS.get(version, rotations)
    except CorruptionError as exc:
        if tail is not None and tail <= fmt.SEGMENT_HEADER.size and not starts and \
                (size < fmt.SEGMENT_HEADER.size or zeroed_segment_header(segments, seg)):
            # a log's next segment, created, its header not (all) written yet: being
            # written right now, or torn by a crash (recovery removes it); or a header a
            # power cut kept from the disk (no sync of the segment completed)
            return size
        report.add("damaged_segment_header", str(exc), segment=seg, offset=0)
    pos = fmt.SEGMENT_HEADER.size
    while pos < size:
        seen.add(pos)
        try:
            record = read_record(segments, seg, pos, size=size)
            if record.rtype not in types:
                raise damaged_record("record of a type segments of this version do not hold",
                                    seg, pos, record.end)
            if record.rtype == fmt.REC_CHUNK:
                if record.codec not in codecs:
                    raise damaged_record("chunk record of a codec segments of this version do "
                                        "not hold", seg, pos, record.end)
                if record.codec == fmt.CODEC_PLANES and \
                        _rotation(record) not in (None, *rotations):
                    raise damaged_record("byte-plane chunk record of a rotation segments of "
                                        "this version do not hold", seg, pos, record.end)
                unusable_base = _check_chunk(record, bases)
                if unusable_base and known.get(pos):
                    report.add("damaged_chunk", unusable_base, set().union(
                        *(affected(cid) for cid, _ in known[pos])), seg, pos)
            for cid, e in known.get(pos, ()):
                mismatch = _entry_mismatch(record, cid, e)
                if mismatch:
                    report.add("index_mismatch", mismatch, affected(cid), seg, pos)
            pos = record.end
            continue
        except DamagedRecord as exc:
            problem, end = exc.reason, exc.end
        except OSError as exc:
            if isinstance(exc, SnapstoreError):
                raise
            problem, end = f"cannot read the record: {exc.strerror or exc}", None
        if tail is not None and pos >= tail and not any(off >= pos for off in starts):
            nxt = next_valid_record(segments, seg, end, pos + 1, size, types)
            if nxt is None or writeback_hole(segments, seg, pos, nxt, size):
                break           # torn tail (a writeback hole too), or a record being appended
        users = set().union(*(affected(cid) for cid, _ in known.get(pos, ())))
        report.add("damaged_record", problem, users, seg, pos)
        i = bisect.bisect_right(starts, pos)
        next_known = starts[i] if i < len(starts) else None
        if end is not None and end <= size and (next_known is None or end <= next_known) and \
                (end == size or parse_record_header(
                    segments.read(seg, end, fmt.RECORD_HEADER.size)) is not None):
            pos = end
        elif next_known is not None:
            pos = next_known
        else:
            break
    for off in starts:
        if off not in seen:
            for cid, _ in known[off]:
                report.add("lost_record", "the index points at an offset where the scan found "
                           "no record", affected(cid), seg, off)
    return size


def _rotation(record) -> int | None:
    """The rotation of a valid CODEC_PLANES record's items (None: too short to name one; its
    decode reports that)."""
    try:
        return planes.rotation_of(stored_chunk(record).stored)
    except ValueError:
        return None


def _check_chunk(record, bases: "_Bases | None" = None) -> str | None:
    """Decodes the chunk of a valid chunk record and re-hashes it; a delta chunk over its base
    (from bases). Raises DamagedRecord for damage of the record itself. Returns why a delta
    chunk could not be checked because its base is unusable (damaged, or not one level less
    deep), else None; a base the index lacks is no problem here: a delta chunk the index
    knows is reported by the index checks (missing_chunk), and a garbage one never decodes."""
    chunk = stored_chunk(record)
    if record.codec != fmt.CODEC_DELTA_PLANES:
        data = decode_chunk(chunk)
    else:
        base_id, depth = delta_base(chunk)
        if bases is None:
            return None
        try:
            base = bases.get(base_id, depth - 1)
        except _MissingBase:
            return None
        except CorruptionError as exc:
            return (f"delta chunk {chunk.chunk_id.hex()[:16]}… does not decode: its base "
                    f"{base_id.hex()[:16]}… is unusable ({exc})")
        data = decode_delta(chunk, base)
    if blake3.blake3(data).digest() != chunk.chunk_id:
        raise damaged_record("chunk bytes do not hash to the chunk id", record.segment,
                            record.offset, record.end)
    return None


class _MissingBase(CorruptionError):
    """A chunk a delta chain names has no index entry."""


class _Bases:
    """The raw bytes of the chunks delta chunks are coded against, for the deep check: read
    through their index entries and checked as a restore reads them (each level re-hashed;
    a base exactly one level less deep than the chunk naming it, down to a plain chunk), so
    a delta chunk is never blamed for its base's damage. Kept up to CACHE_BYTES, failures
    too: a keyframe is the base of a delta chunk in every later checkpoint."""

    CACHE_BYTES = 64 << 20

    def __init__(self, reader, entries: dict) -> None:
        self.reader, self.entries = reader, entries
        self.cache: OrderedDict = OrderedDict()     # (chunk id, depth) -> bytes or the error
        self.cached = 0

    def get(self, cid: bytes, depth: int) -> bytes:
        """Chunk cid's raw bytes, checked to be at `depth` (0: a plain chunk). Raises
        _MissingBase when the index lacks a chunk of the chain, CorruptionError (a
        DamagedRecord naming the record) when one is damaged or at another depth."""
        key = (cid, depth)
        got = self.cache.get(key)
        if got is None:
            try:
                got = self._decode(cid, depth)
            except CorruptionError as exc:
                got = exc
            except OSError as exc:
                if isinstance(exc, SnapstoreError):
                    raise
                got = CorruptionError(f"cannot read chunk {cid.hex()[:16]}…: "
                                      f"{exc.strerror or exc}")
            self._keep(key, got)
        else:
            self.cache.move_to_end(key)
        if isinstance(got, Exception):
            raise got
        return got

    def _keep(self, key: tuple, got) -> None:
        self.cache[key] = got
        self.cached += len(got) if isinstance(got, bytes) else 0
        while self.cached > self.CACHE_BYTES and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cached -= len(old) if isinstance(old, bytes) else 0

    def _decode(self, cid: bytes, depth: int) -> bytes:
        entry = self.entries.get(cid)
        if entry is None:
            raise _MissingBase(f"the index lacks chunk {cid.hex()[:16]}…")
        chunk = read_stored_chunk(self.reader, entry.segment, entry.offset, entry.stored_len,
                                  cid)
        record = chunk.record
        if chunk.raw_len != entry.raw_len:
            raise damaged_record("chunk has the wrong length", record.segment, record.offset,
                                 record.end)
        base_id, own = _record_base(chunk)
        if own != depth:
            raise damaged_record(f"a delta chunk at depth {depth + 1} is coded against this "
                                 f"chunk, at depth {own}", record.segment, record.offset,
                                 record.end)
        data = decode_chunk(chunk) if base_id is None else \
            decode_delta(chunk, self.get(base_id, own - 1))
        if blake3.blake3(data).digest() != cid:
            raise damaged_record("chunk bytes do not hash to the chunk id", record.segment,
                                 record.offset, record.end)
        return bytes(data)
