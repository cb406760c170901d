"""The LMDB index: chunks, checkpoints, manifests, streams, fingerprints and the applied log
position. It is a cache of the log applied up to META_APPLIED; apply_* are the only mutators
of checkpoint state and are used both live and by recovery, so both paths agree.

lmdb.Error never escapes this module: it becomes a snapstore.errors exception.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

import lmdb

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError, FormatError, SnapstoreError, StoreIOError
from snapstore.engine import records
from snapstore.engine.records import Commit
from snapstore.engine.fsutil import DEFAULT_FILE_MODE, NotRegularFile, check_regular
from snapstore.engine.registry import SharedByPath


def _wrap(exc: lmdb.Error, what: str) -> SnapstoreError:
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
                        lmdb.VersionMismatchError, lmdb.BadValsizeError)):
        return CorruptionError(f"index {what}: {exc}")
    if isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)):
        return StoreIOError(f"index {what}: {exc}")
    return StoreIOError(f"index {what}: {exc}")


@contextlib.contextmanager
def _lmdb_errors(what: str):
    try:
        yield
    except lmdb.Error as exc:
        raise _wrap(exc, what) from exc


@dataclass(frozen=True)
class ChunkEntry:
    segment: int
    offset: int
    stored_len: int
    raw_len: int
    refs: int
    codec: int

    def pack(self) -> bytes:
        return fmt.CHUNK_ENTRY.pack(self.segment, self.offset, self.stored_len, self.raw_len,
                                    self.refs, self.codec)

    @classmethod
    def unpack(cls, data: bytes) -> "ChunkEntry":
        return cls(*fmt.CHUNK_ENTRY.unpack(data))


def _stream_key(stream: str, tail: bytes = b"") -> bytes:
    return stream.encode() + b"\0" + tail


# One lmdb.Environment per store directory per process: LMDB forbids opening the same
# environment twice in one process (closing one would drop the other's locks). A fork()ed
# child forgets its parent's (registry.SharedByPath), never using nor closing them.
_ENVS: SharedByPath[lmdb.Environment] = SharedByPath(close=lambda env: env.close())


def _namespace_env_keys_in_child() -> None:
    """In a fork()ed child: lets the child open its own environment of a store its parent has
    open. py-lmdb refuses an environment whose files an Environment of this process holds,
    and a child inherits that set with its parent's Environments, which it must never use nor
    close (closing would abort the parent's transactions, freeing their slots in the shared
    reader table, so the parent's writer could recycle pages the parent is reading). The
    files are identified by lmdb._envid.env_keys, which py-lmdb looks up on every open: in the
    child, keys carry the child's pid, so they never match the inherited ones (and still
    match each other within the child)."""
    try:
        from lmdb import _envid
    except ImportError:             # a py-lmdb without the guard: nothing to do
        return
    original = getattr(_envid.env_keys, "__wrapped__", _envid.env_keys)
    pid = os.getpid()

    def env_keys(path, subdir):
        return tuple(("pid", pid) + tuple(key) for key in original(path, subdir))
    env_keys.__wrapped__ = original
    _envid.env_keys = env_keys


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_namespace_env_keys_in_child)


def _acquire_env(path: str, durable: bool, file_mode: int) -> lmdb.Environment:
    """The process's environment of one store. Opened writable whenever the directory allows
    (read-only Stores never begin write transactions), so readers and a writer of the same
    store can share it in either order; read-only only on read-only file systems. The first
    opener's durability holds while it is shared. New LMDB files get permission bits
    file_mode. Its files must be regular files (CorruptionError otherwise: LMDB would block
    on a FIFO, or write its lock table into whatever a symlink names)."""
    def open_env(real_path: str) -> lmdb.Environment:
        for name in ("data.mdb", "lock.mdb"):
            try:
                check_regular(os.path.join(real_path, name))
            except NotRegularFile as exc:
                raise CorruptionError(f"index file {os.path.join(path, name)} is {exc.kind}, "
                                      "not a regular file: the index is damaged (rebuild it "
                                      "with `snapstore repair`)") from None
        fs_readonly = not os.access(real_path, os.W_OK)
        with _lmdb_errors("open"):
            return lmdb.open(real_path, map_size=fmt.INDEX_MAP_SIZE, subdir=True,
                             max_dbs=fmt.INDEX_MAX_DBS, readonly=fs_readonly, create=False,
                             sync=durable, metasync=False, readahead=False, lock=True,
                             mode=file_mode)

    return _ENVS.acquire(path, open_env)


class Index:
    """The open index of one store."""

    def __init__(self, path: str, *, readonly: bool, durable: bool,
                 file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.readonly = readonly
        self.durable = durable
        if not os.path.isdir(path):
            raise FormatError(f"no index at {path}; not a snapstore store")
        self.env = _acquire_env(path, durable, file_mode)
        try:
            with _lmdb_errors("open databases"):
                self.dbs = {name: self.env.open_db(name, create=not readonly)
                            for name in fmt.INDEX_DBS}
        except (lmdb.NotFoundError, KeyError) as exc:
            _ENVS.release(self.env)
            raise FormatError(f"index at {path} is missing databases; not a snapstore "
                              "store or not initialised") from exc
        except BaseException:
            _ENVS.release(self.env)
            raise
        try:
            self._check_version()
        except BaseException:
            _ENVS.release(self.env)
            raise

    def _check_version(self) -> None:
        """Refuses an index written by a newer format (readers too); stamps a new one."""
        with self.read() as r:
            version = r.txn.get(fmt.META_FORMAT, db=self.dbs[fmt.DB_META])
        if version is not None and fmt.U64.unpack(version)[0] > fmt.FORMAT_VERSION:
            raise FormatError(f"index was written by snapstore format "
                              f"{fmt.U64.unpack(version)[0]}; this snapstore reads up to "
                              f"{fmt.FORMAT_VERSION}: upgrade snapstore")
        if version is None and not self.readonly:
            with self.write() as w:
                w.txn.put(fmt.META_FORMAT, fmt.U64.pack(fmt.FORMAT_VERSION),
                          db=self.dbs[fmt.DB_META])

    def close(self) -> None:
        if self.env is not None:
            _ENVS.release(self.env)
            self.env = None

    @contextlib.contextmanager
    def read(self) -> Iterator["IndexView"]:
        with _lmdb_errors("read"):
            with self.env.begin(buffers=False) as txn:
                yield IndexView(self, txn)

    @contextlib.contextmanager
    def write(self) -> Iterator["IndexWriter"]:
        with _lmdb_errors("write"):
            with self.env.begin(write=True) as txn:
                yield IndexWriter(self, txn)

    def sync(self) -> None:
        """Forces every committed transaction to disk (even with durability "none")."""
        with _lmdb_errors("sync"):
            self.env.sync(True)

    def disk_bytes(self) -> int:
        return self.env.info()["last_pgno"] * self.env.stat()["psize"]


class IndexView:
    """Read access inside one LMDB transaction."""

    def __init__(self, index: Index, txn: lmdb.Transaction) -> None:
        self.index, self.txn, self.dbs = index, txn, index.dbs

    # -- meta
    def applied(self) -> tuple[int, int] | None:
        v = self.txn.get(fmt.META_APPLIED, db=self.dbs[fmt.DB_META])
        return fmt.LOG_POSITION.unpack(v) if v is not None else None

    def next_id(self) -> int:
        v = self.txn.get(fmt.META_NEXT_ID, db=self.dbs[fmt.DB_META])
        return fmt.U64.unpack(v)[0] if v is not None else 1

    # -- chunks
    def chunk(self, chunk_id: bytes) -> ChunkEntry | None:
        v = self.txn.get(chunk_id, db=self.dbs[fmt.DB_CHUNKS])
        return ChunkEntry.unpack(v) if v is not None else None

    def has_chunk(self, chunk_id: bytes) -> bool:
        return self.txn.get(chunk_id, db=self.dbs[fmt.DB_CHUNKS]) is not None

    def chunks(self) -> Iterator[tuple[bytes, ChunkEntry]]:
        with self.txn.cursor(db=self.dbs[fmt.DB_CHUNKS]) as cur:
            for k, v in cur:
                yield bytes(k), ChunkEntry.unpack(v)

    # -- checkpoints
    def checkpoint(self, checkpoint_id: int) -> Commit | None:
        v = self.txn.get(fmt.CKPT_KEY.pack(checkpoint_id), db=self.dbs[fmt.DB_CHECKPOINTS])
        if v is None:
            return None
        try:
            return Commit.from_info_json(json.loads(v))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"index entry of checkpoint {checkpoint_id} is damaged: {exc}")

    def checkpoint_ids(self, stream: str | None = None) -> list[int]:
        if stream is None:
            with self.txn.cursor(db=self.dbs[fmt.DB_CHECKPOINTS]) as cur:
                return [fmt.CKPT_KEY.unpack(k)[0] for k in cur.iternext(values=False)]
        return self._ids_after(fmt.DB_STREAM_CKPTS, _stream_key(stream))

    def _ids_after(self, db: bytes, prefix: bytes) -> list[int]:
        """The checkpoint ids of the keys prefix + CKPT_KEY of db, ascending."""
        out = []
        with self.txn.cursor(db=self.dbs[db]) as cur:
            if cur.set_range(prefix):
                for k in cur.iternext(values=False):
                    if not k.startswith(prefix):
                        break
                    out.append(fmt.CKPT_KEY.unpack(k[len(prefix):])[0])
        return out

    def manifest(self, checkpoint_id: int, buffer_index: int) -> bytes:
        v = self.txn.get(fmt.MANIFEST_KEY.pack(checkpoint_id, buffer_index),
                         db=self.dbs[fmt.DB_MANIFESTS])
        if v is None:
            raise CorruptionError(f"index lacks manifest {buffer_index} of checkpoint "
                                  f"{checkpoint_id}")
        return v

    def children(self, checkpoint_id: int) -> list[int]:
        return self._ids_after(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(checkpoint_id))

    # -- streams
    def streams(self) -> dict[str, int]:
        with self.txn.cursor(db=self.dbs[fmt.DB_STREAMS]) as cur:
            return {k.decode(): json.loads(v)["head"] for k, v in cur}

    def _stream(self, stream: str) -> dict | None:
        v = self.txn.get(stream.encode(), db=self.dbs[fmt.DB_STREAMS])
        return json.loads(v) if v is not None else None

    def stream_head(self, stream: str) -> int | None:
        s = self._stream(stream)
        return s["head"] if s is not None else None

    def stream_seq(self, stream: str) -> int:
        """The seq of the stream's newest checkpoint ever committed (0 for a new stream)."""
        s = self._stream(stream)
        return s.get("seq", 0) if s is not None else 0

    def fingerprints(self, stream: str, buffer: str) -> tuple[int, int, bytes] | None:
        """(checkpoint id, page size, digests) recorded for a stream's buffer, or None."""
        v = self.txn.get(_stream_key(stream, buffer.encode()), db=self.dbs[fmt.DB_FINGERPRINTS])
        if v is None:
            return None
        ckpt, page_size, _ = fmt.FP_HEADER.unpack_from(v)
        return ckpt, page_size, v[fmt.FP_HEADER.size:]


class IndexWriter(IndexView):
    """Write access inside one LMDB write transaction (all or nothing)."""

    def _put(self, db: bytes, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.dbs[db])

    def _delete(self, db: bytes, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[db])

    def set_applied(self, position: tuple[int, int]) -> None:
        self._put(fmt.DB_META, fmt.META_APPLIED, fmt.LOG_POSITION.pack(*position))

    def put_chunk(self, chunk_id: bytes, entry: ChunkEntry) -> None:
        self._put(fmt.DB_CHUNKS, chunk_id, entry.pack())

    def delete_chunk(self, chunk_id: bytes) -> None:
        self._delete(fmt.DB_CHUNKS, chunk_id)

    def _add_refs(self, blob: bytes, delta: int) -> None:
        counts: dict[bytes, int] = {}
        for _, _, _, cid in fmt.EXTENT.iter_unpack(blob):
            counts[cid] = counts.get(cid, 0) + delta
        for cid, d in counts.items():
            entry = self.chunk(cid)
            if entry is None:
                raise CorruptionError(f"a manifest references chunk {cid.hex()[:16]}… which the "
                                      "index does not have")
            refs = entry.refs + d
            if refs < 0:
                raise CorruptionError(f"reference count of chunk {cid.hex()[:16]}… fell below 0")
            self.put_chunk(cid, ChunkEntry(entry.segment, entry.offset, entry.stored_len,
                                           entry.raw_len, refs, entry.codec))

    def _put_info(self, commit: Commit) -> None:
        self._put(fmt.DB_CHECKPOINTS, fmt.CKPT_KEY.pack(commit.id),
                  json.dumps(commit.info_json(), separators=(",", ":")).encode())

    def _put_stream(self, stream: str, head: int, seq: int) -> None:
        self._put(fmt.DB_STREAMS, stream.encode(), json.dumps({"head": head, "seq": seq}).encode())

    def put_checkpoint_info(self, commit: Commit) -> None:
        """Rewrites a checkpoint's JSON record (manifests untouched)."""
        self._put_info(commit)

    def put_manifest(self, checkpoint_id: int, buffer_index: int, blob: bytes) -> None:
        """Replaces one manifest, moving chunk reference counts from the old to the new one."""
        old = self.manifest(checkpoint_id, buffer_index)
        self._add_refs(blob, +1)
        self._add_refs(old, -1)
        self._put(fmt.DB_MANIFESTS, fmt.MANIFEST_KEY.pack(checkpoint_id, buffer_index), blob)

    def apply_tag(self, checkpoint_id: int, tag: str, add: bool,
                  position: tuple[int, int]) -> None:
        commit = self.checkpoint(checkpoint_id)
        if commit is not None:
            tags = set(commit.tags)
            tags.add(tag) if add else tags.discard(tag)
            commit.tags = sorted(tags)
            self._put_info(commit)
        self.set_applied(position)

    def put_fingerprints(self, stream: str, buffer: str, checkpoint_id: int, page_size: int,
                         digests) -> None:
        self._put(fmt.DB_FINGERPRINTS, _stream_key(stream, buffer.encode()),
                  fmt.FP_HEADER.pack(checkpoint_id, page_size, 0) + bytes(digests))

    def _drop_fingerprints(self, stream: str) -> None:
        prefix = _stream_key(stream)
        with self.txn.cursor(db=self.dbs[fmt.DB_FINGERPRINTS]) as cur:
            if cur.set_range(prefix):
                while cur.key().startswith(prefix):
                    if not cur.delete():
                        break

    def apply_record(self, rtype: int, payload, position: tuple[int, int]) -> None:
        """Applies one index record of the log (commit, delete, tag); position is just past
        it. The one entry point both the live path and recovery use."""
        if rtype == fmt.REC_COMMIT:
            self.apply_commit(Commit.decode(payload), position)
        elif rtype == fmt.REC_DELETE:
            self.apply_delete(records.decode_delete(payload), position)
        elif rtype == fmt.REC_TAG:
            self.apply_tag(*records.decode_tag(payload), position)

    def apply_commit(self, commit: Commit, position: tuple[int, int]) -> None:
        """Makes a committed checkpoint visible; `position` is just past its commit record."""
        for cid, seg, off, stored, raw, codec in fmt.NEW_CHUNK.iter_unpack(commit.new_chunks):
            if not self.has_chunk(cid):
                self.put_chunk(cid, ChunkEntry(seg, off, stored, raw, 0, codec))
        for i, b in enumerate(commit.buffers):
            self._add_refs(b.extents, +1)
            self._put(fmt.DB_MANIFESTS, fmt.MANIFEST_KEY.pack(commit.id, i), b.extents)
        self._put_info(commit)
        key = fmt.CKPT_KEY.pack(commit.id)
        self._put(fmt.DB_STREAM_CKPTS, _stream_key(commit.stream, key), b"")
        if commit.parent is not None:
            self._put(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(commit.parent) + key, b"")
        self._put_stream(commit.stream, commit.id, max(commit.seq, self.stream_seq(commit.stream)))
        next_id = max(self.next_id(), commit.id + 1)
        self._put(fmt.DB_META, fmt.META_NEXT_ID, fmt.U64.pack(next_id))
        self.set_applied(position)

    def apply_delete(self, checkpoint_id: int, position: tuple[int, int]) -> None:
        """Removes a checkpoint; its children absorb its manifests so they stay restorable."""
        victim = self.checkpoint(checkpoint_id)
        if victim is not None:
            self._remove(victim)
        self.set_applied(position)

    def _refresh_depths(self, top: Commit) -> None:
        """Recomputes the delta depths of top's descendants from top's (depth is derived:
        a delta buffer's depth is its parent's depth of that buffer plus one)."""
        todo = [top]
        while todo:
            parent = todo.pop()
            depths = {b.name: b.depth for b in parent.buffers}
            for child_id in self.children(parent.id):
                child = self.checkpoint(child_id)
                changed = False
                for b in child.buffers:
                    if b.base == "delta" and b.depth != depths[b.name] + 1:
                        b.depth, changed = depths[b.name] + 1, True
                if changed:
                    self._put_info(child)
                    todo.append(child)

    def _remove(self, victim: Commit) -> None:
        vkey = fmt.CKPT_KEY.pack(victim.id)
        by_name = {b.name: i for i, b in enumerate(victim.buffers)}
        for child_id in self.children(victim.id):
            child = self.checkpoint(child_id)
            for i, b in enumerate(child.buffers):
                if b.base != "delta":
                    continue
                vi = by_name[b.name]
                old = self.manifest(child.id, i)
                merged = ext.pack(ext.overlay(ext.unpack(self.manifest(victim.id, vi)),
                                              ext.unpack(old)))
                self._add_refs(merged, +1)
                self._add_refs(old, -1)
                self._put(fmt.DB_MANIFESTS, fmt.MANIFEST_KEY.pack(child.id, i), merged)
                b.base, b.depth = victim.buffers[vi].base, victim.buffers[vi].depth
                b.extents = merged
            child.parent = victim.parent
            self._put_info(child)
            self._delete(fmt.DB_CHILDREN, vkey + fmt.CKPT_KEY.pack(child.id))
            if victim.parent is not None:
                self._put(fmt.DB_CHILDREN,
                          fmt.CKPT_KEY.pack(victim.parent) + fmt.CKPT_KEY.pack(child.id), b"")
            self._refresh_depths(child)
        for i in range(len(victim.buffers)):
            self._add_refs(self.manifest(victim.id, i), -1)
            self._delete(fmt.DB_MANIFESTS, fmt.MANIFEST_KEY.pack(victim.id, i))
        self._delete(fmt.DB_CHECKPOINTS, vkey)
        self._delete(fmt.DB_STREAM_CKPTS, _stream_key(victim.stream, vkey))
        if victim.parent is not None:
            self._delete(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(victim.parent) + vkey)
        if self.stream_head(victim.stream) == victim.id:
            remaining = self.checkpoint_ids(victim.stream)
            if remaining:
                self._put_stream(victim.stream, remaining[-1], self.stream_seq(victim.stream))
            else:
                self._delete(fmt.DB_STREAMS, victim.stream.encode())
                self._drop_fingerprints(victim.stream)
