"""Savepoint files: one checkpoint in one self-contained, portable file (like a Flink
savepoint), written and read here; layout in docs/design.md ("Savepoint files"), constants in
format.py (SAVEPOINT_*).

    SAVEPOINT_HEADER   magic, version, JSON length, manifests length, their checksum, its own
    description        UTF-8 JSON of the checkpoint (stream, created, meta, tags, source,
                       buffers), then each buffer's full manifest (EXTENTs) in buffer order
    chunk records      every chunk the manifests name, once: records exactly as in segments
    SAVEPOINT_TRAILER  magic, number of chunk records, its own offset, XXH3-64 of the file

Reading (read_savepoint) checks everything before anyone can use any of it: the header, the
description's checksum and shape, every manifest (full, covering its buffer), every chunk
record with the log's one record validator and the one chunk decoder (checksum, id, codec,
length) and its BLAKE3 against its id, that the records hold exactly the chunks the
manifests name and that every extent lies inside its chunk, the trailer, and the checksum of
the whole file. Damage raises CorruptionError naming the file and the offset; a file that is
not a savepoint, or one of a newer version, FormatError. Nothing is imported from a file
that fails any check.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import blake3
import xxhash

from snapstore import _native as native
from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine.backends.base import SegmentReader
from snapstore.engine.chunks import decode_chunk, read_chunk, stored_chunk
from snapstore.engine.fsutil import fsync_directory, replace_file
from snapstore.engine.validation import is_created_time, validate_name
from snapstore.engine.wal import encode_record_header, read_record
from snapstore.engine.writer import WriteOptions, encode_chunk
from snapstore.errors import (CorruptionError, DamagedRecord, FormatError, InvalidArgumentError,
                              StoreIOError)

_HASH_BLOCK = 1 << 20


@dataclass
class Description:
    """A savepoint's checkpoint: what its description holds.

    buffers: [(name, size, layout, page_size, extents)], extents [(offset, length, chunk id,
    chunk offset)] covering the buffer (the order Store.layout uses). source: where it was
    exported from ({"store", "id", "seq"}; informative)."""
    stream: str
    created: float
    meta: Any
    tags: list
    source: dict
    buffers: list = field(default_factory=list)

    def chunk_ids(self) -> list[bytes]:
        """The distinct chunk ids the manifests name, in order of first use."""
        return list(dict.fromkeys(e[2] for b in self.buffers for e in b[4]))


def write_savepoint(path: str, description: Description,
                    read_chunks: Callable[[list], Iterable], opts: WriteOptions,
                    refuse_existing: Callable[[str], Exception] | None = None) -> dict:
    """Writes description and its chunks as a savepoint file at path: into a temporary file
    next to it, fsynced, renamed over path (a symlink there is replaced, never followed), the
    directory fsynced (refuse_existing: never replace a file at path, see
    fsutil.replace_file). read_chunks(chunk ids) -> iterable of (chunk id, raw bytes) must yield
    each asked chunk once (in any order); each is checked against its BLAKE3 id and stored
    compressed per opts (writer.encode_chunk, the store's rule). Returns {"bytes": the file's
    size, "chunks": chunk records, "chunk_bytes": their raw bytes}. Raises CorruptionError
    for a chunk that is not what it claims, OSError from writing; on any failure no file is
    left."""
    js = json.dumps(_description_json(description), separators=(",", ":"),
                    allow_nan=False).encode()
    manifests = b"".join(fmt.EXTENT.pack(off, coff, length, cid)
                         for b in description.buffers for off, length, cid, coff in b[4])
    wanted = description.chunk_ids()
    stats = {"chunks": 0, "chunk_bytes": 0, "bytes": 0}

    def fill(f) -> None:
        out = _HashingWriter(f)
        head = fmt.SAVEPOINT_HEADER.pack(fmt.SAVEPOINT_MAGIC, fmt.SAVEPOINT_VERSION, 0, len(js),
                                         len(manifests), _xxh64(js, manifests), 0)[:40]
        out.write(head + fmt.U64.pack(xxhash.xxh3_64_intdigest(head)))
        out.write(js)
        out.write(manifests)
        todo = dict.fromkeys(wanted)
        source = read_chunks(list(wanted)) if wanted else ()
        try:
            for cid, data in source:
                if cid not in todo:
                    raise CorruptionError(f"chunk {bytes(cid).hex()[:16]}… was given twice or "
                                          "not asked for")
                del todo[cid]
                if blake3.blake3(data).digest() != cid:
                    raise CorruptionError(f"the bytes given for chunk {cid.hex()[:16]}… are "
                                          "not that chunk")
                codec, parts = encode_chunk(cid, data, opts)
                out.write(encode_record_header(fmt.REC_CHUNK, codec, parts))
                for p in parts:
                    out.write(p)
                stats["chunks"] += 1
                stats["chunk_bytes"] += len(data)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        if todo:
            raise CorruptionError(f"{len(todo)} chunk(s) of the checkpoint were not given")
        tail = fmt.SAVEPOINT_TRAILER.pack(fmt.SAVEPOINT_TRAILER_MAGIC, stats["chunks"],
                                          out.pos, 0)[:24]
        out.hasher.update(tail)
        f.write(tail + fmt.U64.pack(out.hasher.intdigest()))
        stats["bytes"] = out.pos + fmt.SAVEPOINT_TRAILER.size

    replace_file(path, fill, sync=True, refuse_existing=refuse_existing)
    fsync_directory(os.path.dirname(os.path.abspath(path)))
    return stats


def _description_json(d: Description) -> dict:
    return {"format": fmt.SAVEPOINT_FORMAT, "stream": d.stream, "created": d.created,
            "meta": d.meta, "tags": list(d.tags), "source": d.source,
            "buffers": [{"name": name, "size": size, "layout": layout, "page_size": page_size,
                         "extents": len(extents)}
                        for name, size, layout, page_size, extents in d.buffers],
            "chunks": len(d.chunk_ids())}


class _HashingWriter:
    """Writes to a file object, hashing (XXH3-64) and counting what passes."""

    def __init__(self, f) -> None:
        self.f, self.hasher, self.pos = f, xxhash.xxh3_64(), 0

    def write(self, data) -> None:
        self.f.write(data)
        self.hasher.update(data)
        self.pos += len(data)


def _xxh64(*parts) -> int:
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    return h.intdigest()


# ---- reading ---------------------------------------------------------------------------------

class _FileReader(SegmentReader):
    """The savepoint file as a read session of "segment" 0, so that the log's one record
    validator and the one chunk decoder read its chunk records as they read a segment's."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, number: int, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        pass


class Savepoint:
    """An open, checked savepoint file (read_savepoint): its description, and its chunks by
    id (read_chunks). Use it as a context manager (close() closes the file)."""

    def __init__(self, path: str, fd: int, description: Description, table: dict) -> None:
        self.path, self._fd, self.description, self._table = path, fd, description, table

    def read_chunks(self, chunk_ids) -> Iterator[tuple[bytes, bytes]]:
        """Yields (chunk id, raw bytes) of each of chunk_ids, read again and checked again by
        the one chunk decoder (the file may have changed since it was checked)."""
        reader = _FileReader(self._fd)
        for cid in chunk_ids:
            where = self._table.get(cid)
            if where is None:
                raise CorruptionError(f"the savepoint holds no chunk {cid.hex()[:16]}…",
                                      file=self.path)
            offset, stored_len, raw_len = where
            try:
                data = read_chunk(reader, 0, offset, stored_len, cid, raw_len)
            except DamagedRecord as exc:
                raise _damaged(self.path, exc) from None
            if blake3.blake3(data).digest() != cid:
                raise CorruptionError(f"chunk {cid.hex()[:16]}… does not hash to its id (the "
                                      "file changed since it was checked)", file=self.path,
                                      offset=offset)
            yield cid, bytes(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "Savepoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_savepoint(path: str) -> Savepoint:
    """Opens and checks the savepoint file at path (see the module doc); returns a Savepoint.
    Raises InvalidArgumentError (no such file), FormatError (not a savepoint file, not a
    regular file, a newer version), CorruptionError (damage: names the file and offset),
    StoreIOError (reading failed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidArgumentError(f"no savepoint file {path}") from None
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror or exc}", exc.errno) from exc
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path} is not a regular file, so not a savepoint file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror or exc}", exc.errno) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(f"{path} is not a regular file, so not a savepoint file")
        description, table = _check(path, fd)
        return Savepoint(path, fd, description, table)
    except OSError as exc:
        os.close(fd)
        if isinstance(exc, StoreIOError):
            raise
        raise StoreIOError(f"cannot read {path}: {exc.strerror or exc}", exc.errno) from exc
    except BaseException:
        os.close(fd)
        raise


def _check(path: str, fd: int) -> tuple[Description, dict]:
    size = os.fstat(fd).st_size
    hsize, tsize = fmt.SAVEPOINT_HEADER.size, fmt.SAVEPOINT_TRAILER.size
    head = os.pread(fd, hsize, 0)
    magic = fmt.SAVEPOINT_MAGIC
    if head[:len(magic)] != magic[:len(head)] or not head:
        raise FormatError(f"{path} is not a snapstore savepoint file (no {magic!r} header)")
    if len(head) < hsize:
        raise CorruptionError("the savepoint is truncated inside its header", file=path,
                              offset=len(head))
    _, version, reserved, js_len, mf_len, desc_sum, head_sum = \
        fmt.SAVEPOINT_HEADER.unpack(head)
    if xxhash.xxh3_64_intdigest(head[:40]) != head_sum:
        raise CorruptionError("the savepoint's header is damaged (checksum mismatch)",
                              file=path, offset=0)
    if version > fmt.SAVEPOINT_VERSION:
        raise FormatError(f"{path} is a savepoint of version {version}, written by a newer "
                          f"snapstore; this one reads up to version {fmt.SAVEPOINT_VERSION}: "
                          "upgrade snapstore")
    if version != fmt.SAVEPOINT_VERSION or reserved:
        raise CorruptionError(f"the savepoint's header names version {version} (reserved "
                              f"{reserved})", file=path, offset=0)
    records_start = hsize + js_len + mf_len
    end = size - tsize                      # where the trailer must begin
    if records_start > end:
        raise CorruptionError(f"the savepoint is truncated: {size} bytes, its header "
                              f"announces {records_start + tsize} at least", file=path,
                              offset=size)
    js = os.pread(fd, js_len, hsize)
    manifests = os.pread(fd, mf_len, hsize + js_len)
    if _xxh64(js, manifests) != desc_sum:
        raise CorruptionError("the savepoint's description is damaged (checksum mismatch)",
                              file=path, offset=hsize)
    try:
        d, counts, chunks = _parse_description(json.loads(js, parse_constant=_no_constant))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptionError(f"the savepoint's description is invalid: {exc}", file=path,
                              offset=hsize) from None
    if sum(counts) * fmt.EXTENT.size != mf_len:
        raise CorruptionError(f"the savepoint's manifests hold {mf_len} bytes, its "
                              f"description announces {sum(counts)} extents", file=path,
                              offset=hsize + js_len)
    pos = 0
    for i, (name, bsize, layout, page_size) in enumerate(d.buffers):
        blob = manifests[pos:pos + counts[i] * fmt.EXTENT.size]
        extents = ext.unpack(blob)
        try:
            ext.check_manifest(extents, bsize, True, f"buffer {name!r}")
        except CorruptionError as exc:
            raise CorruptionError(str(exc), file=path, offset=hsize + js_len + pos) from None
        d.buffers[i] = (name, bsize, layout, page_size,
                        [(off, length, cid, coff) for off, coff, length, cid in extents])
        pos += len(blob)
    trailer = os.pread(fd, tsize, end)
    t_magic, t_count, t_offset, t_sum = fmt.SAVEPOINT_TRAILER.unpack(trailer)
    if t_magic != fmt.SAVEPOINT_TRAILER_MAGIC or t_offset != end:
        raise CorruptionError("the savepoint has no valid trailer at its end: it is truncated "
                              "or damaged", file=path, offset=end)
    table = _check_records(path, fd, records_start, end)
    if len(table) != t_count or len(table) != chunks:
        raise CorruptionError(f"the savepoint holds {len(table)} chunk records; its trailer "
                              f"says {t_count}, its description {chunks}", file=path,
                              offset=end)
    named = d.chunk_ids()
    lacking = [c for c in named if c not in table]
    if lacking or len(named) != len(table):
        raise CorruptionError(f"the savepoint's chunk records are not the chunks its "
                              f"manifests name ({len(lacking)} missing, "
                              f"{len(table) - len(named) + len(lacking)} extra)", file=path,
                              offset=records_start)
    at = hsize + js_len
    for name, _, _, _, extents in d.buffers:
        for off, length, cid, coff in extents:
            if coff + length > table[cid][2]:
                raise CorruptionError(f"buffer {name!r}: the extent at byte {off} reaches past "
                                      f"the end of chunk {cid.hex()[:16]}…", file=path,
                                      offset=at)
            at += fmt.EXTENT.size
    h = xxhash.xxh3_64()
    pos, stop = 0, end + fmt.SAVEPOINT_TRAILER.size - fmt.U64.size
    while pos < stop:
        block = os.pread(fd, min(_HASH_BLOCK, stop - pos), pos)
        if not block:
            break
        h.update(block)
        pos += len(block)
    if pos != stop or h.intdigest() != t_sum:
        raise CorruptionError("the savepoint's checksum does not match its bytes", file=path,
                              offset=end + 24)
    return d, table


def _no_constant(name: str):
    """json.loads' hook for NaN, Infinity and -Infinity: a writer never puts them there
    (allow_nan=False), so a description holding one is not a savepoint's."""
    raise ValueError(f"the JSON holds {name}")


def _parse_description(d: dict) -> tuple[Description, list, int]:
    """(Description with buffers (name, size, layout, page_size) to be completed, extents
    per buffer, chunk count) of the description's JSON; ValueError/KeyError/TypeError on any
    field that is not what it must be."""
    if d["format"] != fmt.SAVEPOINT_FORMAT:
        raise ValueError(f"format is {d['format']!r}")
    created = d["created"]
    if not is_created_time(created):
        raise ValueError(f"created is {created!r}")
    tags = d["tags"]
    if not isinstance(tags, list):
        raise TypeError("tags is not a list")
    if not isinstance(d["source"], dict):
        raise TypeError("source is not an object")
    buffers, counts, names = [], [], set()
    for b in d["buffers"]:
        name = _name(b["name"], "buffer name")
        if name in names:
            raise ValueError(f"buffer {name!r} appears twice")
        names.add(name)
        page_size = b["page_size"]
        if b["layout"] not in fmt.CHUNKING_MODES or not _uint(page_size) or \
                not native.PAGE_MIN <= page_size <= native.PAGE_MAX or \
                page_size & (page_size - 1):
            raise ValueError(f"buffer {name!r} has layout {b['layout']!r}, page size "
                             f"{page_size!r}")
        buffers.append((name, _uint(b["size"]), b["layout"], page_size))
        counts.append(_uint(b["extents"]))
    description = Description(_name(d["stream"], "stream"), float(created), d["meta"],
                              [_name(t, "tag") for t in tags], d["source"], buffers)
    return description, counts, _uint(d["chunks"])


def _name(value: Any, what: str) -> str:
    try:
        return validate_name(value, what)
    except InvalidArgumentError as exc:
        raise ValueError(str(exc)) from None


def _uint(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{v!r} is not a non-negative integer")
    return v


def _check_records(path: str, fd: int, start: int, end: int) -> dict:
    """{chunk id: (record offset, payload length, raw length)} of the chunk records in
    [start, end), each validated, decoded and hashed."""
    reader = _FileReader(fd)
    table: dict[bytes, tuple] = {}
    pos = start
    while pos < end:
        try:
            record = read_record(reader, 0, pos, size=end)
            if record.rtype != fmt.REC_CHUNK:
                raise CorruptionError(f"the savepoint holds a record of type {record.rtype} "
                                      "where only chunk records belong", file=path, offset=pos)
            chunk = stored_chunk(record)
            data = decode_chunk(chunk)
        except DamagedRecord as exc:
            raise _damaged(path, exc) from None
        if blake3.blake3(data).digest() != chunk.chunk_id:
            raise CorruptionError(f"chunk {chunk.chunk_id.hex()[:16]}… does not hash to its "
                                  "id (BLAKE3 mismatch)", file=path, offset=pos)
        if chunk.chunk_id in table:
            raise CorruptionError(f"chunk {chunk.chunk_id.hex()[:16]}… is in the savepoint "
                                  "twice", file=path, offset=pos)
        table[chunk.chunk_id] = (pos, record.length, chunk.raw_len)
        pos = record.end
    return table


def _damaged(path: str, exc: DamagedRecord) -> CorruptionError:
    """A damaged chunk record of a savepoint, named by file and offset (not by segment)."""
    return CorruptionError(f"damaged chunk record in the savepoint: {exc.reason}", file=path,
                           offset=exc.offset)
