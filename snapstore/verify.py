"""Verification: prove the index consistent with itself and with the log, and (deep) that every
stored byte still matches its checksum and its chunk id.

Shallow: checkpoints, chains, manifests, streams and exact reference counts; every chunk
record the index points at has a valid header and checksum. Deep: additionally every record
of every segment (live or not) is read and checked, and every chunk is decompressed and
re-hashed with BLAKE3. Each problem lists the checkpoints whose restore it would break
(including later checkpoints that build on them through delta chains).
"""
from __future__ import annotations

import bisect
import time
from collections import Counter, defaultdict

import blake3
import zstandard

from . import extents as ext
from . import format as fmt
from .errors import CorruptionError
from .index import Index
from .segments import (SegmentBackend, check_segment_header, parse_header, read_chunk_record,
                       record_checksum, segment_name)


class _Report:
    def __init__(self) -> None:
        self.problems: list[dict] = []

    def add(self, kind: str, message: str, checkpoints=(), segment: int | None = None,
            offset: int | None = None) -> None:
        self.problems.append({"kind": kind, "message": message,
                              "checkpoints": sorted(set(checkpoints)),
                              "segment": segment_name(segment) if segment is not None else None,
                              "offset": offset})


def _dependents(commits: dict, children: dict, start: set[tuple[int, str]]) -> set[int]:
    """Checkpoint ids whose buffer restore reads a manifest in `start` ((id, buffer) pairs)."""
    out, todo = set(), list(start)
    while todo:
        cid, name = todo.pop()
        if cid in out and (cid, name) not in start:
            continue
        out.add(cid)
        for child in children.get(cid, ()):
            for b in commits[child].buffers:
                if b.name == name and b.base == "delta":
                    todo.append((child, name))
    return out


def verify(index: Index, backend: SegmentBackend, *, deep: bool = False) -> dict:
    started = time.perf_counter()
    report = _Report()
    with index.read() as r:
        commits = {i: r.checkpoint(i) for i in r.checkpoint_ids()}
        chunks = dict(r.chunks())
        streams = r.streams()
        stream_members = {s: r.checkpoint_ids(s) for s in streams}
        manifests = {}
        for i, c in commits.items():
            for bi in range(len(c.buffers)):
                try:
                    manifests[(i, bi)] = ext.unpack(r.manifest(i, bi))
                except CorruptionError as exc:
                    report.add("missing_manifest", str(exc), [i])
    children: dict[int, list] = defaultdict(list)
    for i, c in commits.items():
        if c.parent is not None:
            children[c.parent].append(i)
    users: dict[bytes, set] = defaultdict(set)     # chunk id -> {(checkpoint, buffer name)}
    refs: Counter = Counter()

    # -- checkpoints, chains and manifests
    for i, c in commits.items():
        parent = commits.get(c.parent) if c.parent is not None else None
        if c.parent is not None and parent is None:
            report.add("missing_parent", f"checkpoint {i} names missing parent {c.parent}", [i])
        for bi, b in enumerate(c.buffers):
            extents = manifests.get((i, bi))
            if extents is None:
                continue
            end = 0
            for off, coff, length, cid in extents:
                if length <= 0 or off < end or off + length > b.size:
                    report.add("bad_extent", f"checkpoint {i} buffer {b.name!r}: extent "
                               f"{off}+{length} is out of order or out of bounds", [i])
                end = max(end, off + length)
                refs[cid] += 1
                users[cid].add((i, b.name))
                entry = chunks.get(cid)
                if entry is None:
                    report.add("missing_chunk", f"checkpoint {i} buffer {b.name!r} references "
                               f"chunk {cid.hex()[:16]}… which the index lacks", [i])
                elif coff + length > entry.raw_len:
                    report.add("bad_extent", f"checkpoint {i} buffer {b.name!r}: extent reaches "
                               f"past the end of chunk {cid.hex()[:16]}…", [i])
            if b.base == "full" and ext.covered_bytes(extents) != b.size:
                report.add("incomplete_manifest", f"checkpoint {i} buffer {b.name!r}: full "
                           f"manifest covers {ext.covered_bytes(extents)} of {b.size} bytes", [i])
            if b.base == "delta":
                pb = next((p for p in parent.buffers if p.name == b.name), None) if parent else None
                if pb is None or pb.size != b.size:
                    report.add("broken_chain", f"checkpoint {i} buffer {b.name!r} is a delta "
                               "without a matching buffer in its parent", [i])
                elif pb.depth + 1 != b.depth:
                    report.add("broken_chain", f"checkpoint {i} buffer {b.name!r} has depth "
                               f"{b.depth}, its parent's is {pb.depth}", [i])
        if c.stream not in streams or i not in stream_members.get(c.stream, ()):
            report.add("stream", f"checkpoint {i} is not listed in its stream {c.stream!r}", [i])
    for s, head in streams.items():
        if head not in commits or commits[head].stream != s:
            report.add("stream", f"stream {s!r} names head {head}, which is not one of its "
                       "checkpoints")
    for cid, entry in chunks.items():
        if entry.refs != refs.get(cid, 0):
            report.add("refcount", f"chunk {cid.hex()[:16]}… has reference count {entry.refs}, "
                       f"manifests reference it {refs.get(cid, 0)} times",
                       _dependents(commits, children, users.get(cid, set())),
                       entry.segment, entry.offset)

    def affected(cid: bytes) -> set[int]:
        return _dependents(commits, children, users.get(cid, set()))

    # -- segments: the records the index points at
    present = set(backend.list())
    by_segment: dict[int, list] = defaultdict(list)
    for cid, e in chunks.items():
        by_segment[e.segment].append((e.offset, cid, e))
    for seg in sorted(by_segment):
        if seg not in present:
            report.add("missing_segment", "segment file is missing",
                       set().union(*(affected(cid) for _, cid, _ in by_segment[seg])), seg)
    bytes_checked = 0
    if not deep:
        for seg in sorted(set(by_segment) & present):
            for off, cid, e in sorted(by_segment[seg], key=lambda t: t[0]):
                try:
                    read_chunk_record(backend, seg, off, e.stored_len, cid)
                    bytes_checked += fmt.RECORD_HEADER.size + e.stored_len
                except CorruptionError as exc:
                    report.add("damaged_chunk", str(exc), affected(cid), seg, off)
    else:
        for seg in sorted(present):
            known = {off: (cid, e) for off, cid, e in by_segment.get(seg, [])}
            bytes_checked += _deep_scan(backend, seg, known, report, affected)

    problems = report.problems
    return {"ok": not problems, "deep": deep, "problems": problems,
            "checkpoints": len(commits), "chunks": len(chunks), "segments": len(present),
            "bytes_checked": bytes_checked, "seconds": time.perf_counter() - started}


def _deep_scan(backend: SegmentBackend, seg: int, known: dict, report: _Report, affected) -> int:
    """Checks every record of one segment; after damage, resumes at the next record the index
    knows of. Returns bytes read."""
    size = backend.size(seg)
    starts = sorted(known)
    seen = set()
    decompressor = zstandard.ZstdDecompressor()
    try:
        check_segment_header(backend.read(seg, 0, fmt.SEGMENT_HEADER.size), seg, segment_name(seg))
    except CorruptionError as exc:
        report.add("damaged_segment_header", str(exc), segment=seg, offset=0)
    pos = fmt.SEGMENT_HEADER.size
    while pos < size:
        head = backend.read(seg, pos, fmt.RECORD_HEADER.size)
        parsed = parse_header(head, "", pos)
        problem = None
        if parsed is None:
            problem = "record header is damaged"
        else:
            rtype, codec, length, checksum = parsed
            end = pos + fmt.RECORD_HEADER.size + length
            if end > size:
                problem = "record runs past the end of the segment"
            else:
                payload = backend.read(seg, pos + fmt.RECORD_HEADER.size, length)
                if record_checksum(head[:fmt.RECORD_CHECKSUMMED_PREFIX], [payload]) != checksum:
                    problem = "record checksum mismatch"
                elif rtype == fmt.REC_CHUNK:
                    problem = _check_chunk_payload(payload, codec, decompressor)
        if problem is not None:
            cid = known.get(pos, (None,))[0]
            report.add("damaged_record", problem, affected(cid) if cid else (), seg, pos)
            seen.add(pos)
            if parsed is not None and problem != "record header is damaged" and end <= size:
                pos = end
                continue
            i = bisect.bisect_right(starts, pos)
            if i == len(starts):
                break
            pos = starts[i]
            continue
        seen.add(pos)
        pos = end
    for off in starts:
        if off not in seen:
            cid = known[off][0]
            report.add("lost_record", "the index points at an offset where the scan found no "
                       "record", affected(cid), seg, off)
    return size


def _check_chunk_payload(payload: bytes, codec: int, decompressor) -> str | None:
    if len(payload) < fmt.CHUNK_PREFIX.size:
        return "chunk record too short"
    cid, raw_len = fmt.CHUNK_PREFIX.unpack_from(payload)
    data = memoryview(payload)[fmt.CHUNK_PREFIX.size:]
    if codec == fmt.CODEC_ZSTD:
        try:
            data = decompressor.decompress(data, max_output_size=raw_len)
        except zstandard.ZstdError as exc:
            return f"chunk does not decompress: {exc}"
    if len(data) != raw_len:
        return "chunk has the wrong length"
    if blake3.blake3(data).digest() != cid:
        return "chunk bytes do not hash to the chunk id"
    return None
