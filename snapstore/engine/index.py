"""The LMDB index: chunks, checkpoints, manifests, streams, fingerprints and the applied log
position. It is a cache of the log applied up to META_APPLIED; apply_* are the only mutators
of checkpoint state and are used both live and by recovery, so both paths agree.

The index is a checked cache. From format 2 on, every value of every database carries an
XXH3-64 of (database, key, payload) (format.INDEX_VALUE_CHECKSUM): seal() adds it and unseal()
verifies it, and every put and get of this module goes through that one pair; a mismatch
raises CorruptionError naming the database and key. A view knows the format of its snapshot
(META_FORMAT) and takes format 1 values, which have no checksum, as they are (upgrade.py
converts a format 1 index when a writer opens it). At open, LMDB's data file is checked
against the last page LMDB will touch, so a truncated index raises CorruptionError instead of
killing the process with SIGBUS.

lmdb.Error never escapes this module: it becomes a snapstore.errors exception.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import fcntl
import json
import math
import os
import stat
import struct
import threading
import time
from typing import Callable, Iterator, NamedTuple

import lmdb
import xxhash

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import indexswap
from snapstore.engine.crashpoints import crashpoint
from snapstore.errors import CorruptionError, FormatError, SnapstoreError, StoreIOError
from snapstore.engine import records
from snapstore.engine.records import Commit
from snapstore.engine.writegate import WriterGate, writer_gate
from snapstore.engine.fsutil import DEFAULT_FILE_MODE, NotRegularFile, check_regular, file_kind
from snapstore.engine.registry import SharedByPath

REPAIR_HINT = "run `snapstore repair` to rebuild the index from the log"


def damaged(message: str) -> CorruptionError:
    """The CorruptionError for damage in the index: it names the way out."""
    return CorruptionError(f"{message}: the index is damaged; {REPAIR_HINT}")


def _wrap(exc: lmdb.Error, what: str, path: str | None = None) -> SnapstoreError:
    # MDB_BAD_TXN too: LMDB's cursor setup ignores a failure to refresh a damaged database
    # handle, and the next call of the transaction then reports only that it must abort
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
                        lmdb.VersionMismatchError, lmdb.BadValsizeError, lmdb.BadTxnError)):
        return damaged(f"index {what}: {exc}")
    if isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)):
        return StoreIOError(f"index {what}: {exc}")
    free = _free_bytes(path) if path is not None and "Input/output error" in str(exc) \
        else None
    if free is not None and free < _NEARLY_FULL_BYTES:
        # LMDB turns a short write (ENOSPC on the way) into EIO: say what it most likely is
        return StoreIOError(f"index {what}: disk full (the file system of {path} has "
                            f"{free} bytes free; LMDB reported: {exc})", errno.ENOSPC)
    return StoreIOError(f"index {what}: {exc}")


_NEARLY_FULL_BYTES = 4 << 20      # less free than this: an index write's EIO is a full disk


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def lmdb_errors(what: str, path: str | None = None):
    """Raises an LMDB error of the with block as the snapstore error it means (damage:
    CorruptionError naming `snapstore repair`; else StoreIOError: "disk full" for an I/O
    error while the file system of `path`, the index, is all but full)."""
    try:
        yield
    except lmdb.Error as exc:
        raise _wrap(exc, what, path) from exc


# ---- the value envelope (format 2): payload + XXH3-64 of (database, key, payload) -----------
# unseal runs for every value read (a restore reads one chunk entry per chunk), so the digest
# input is one concatenation: _HEAD[db][len(key)] is the database name, NUL and key length
# (LMDB keys are at most 511 bytes), followed by the key and the payload.
_HEAD = {db: tuple(db + b"\0" + fmt.INDEX_KEY_LENGTH.pack(n) for n in range(512))
         for db in fmt.INDEX_DBS}
_CHECKSUM_AT = fmt.INDEX_VALUE_CHECKSUM.unpack_from
_CHECKSUM_BYTES = fmt.INDEX_VALUE_CHECKSUM.size
_xxh3_64 = xxhash.xxh3_64_intdigest


def seal(db: bytes, key: bytes, payload: bytes) -> bytes:
    """The value stored for `payload` under `key` in database `db` (format 2 and later)."""
    return payload + fmt.INDEX_VALUE_CHECKSUM.pack(_xxh3_64(_HEAD[db][len(key)] + key + payload))


def unseal(db: bytes, key: bytes, value: bytes, version: int) -> bytes:
    """The payload of a value read from database `db` under `key`, in an index of format
    `version`; CorruptionError (naming database and key) unless its checksum matches."""
    if version < fmt.INDEX_CHECKSUMS_SINCE:
        return value
    payload = value[:-_CHECKSUM_BYTES]
    if len(value) < _CHECKSUM_BYTES or _CHECKSUM_AT(value, len(payload))[0] != \
            _xxh3_64(_HEAD[db][len(key)] + key + payload):
        raise damaged(f"index value {describe_key(db, key)} fails its checksum")
    return payload


def key_number(db: bytes, key: bytes, layout: struct.Struct = fmt.CKPT_KEY) -> int:
    """The number a key of `layout` (a checkpoint id, a claim's order) holds; CorruptionError
    naming the key when a damaged index gives a key of another length (struct.error
    otherwise)."""
    if len(key) != layout.size:
        raise damaged(f"index key {describe_key(db, key)} is not a {layout.size}-byte key")
    return layout.unpack(key)[0]


def describe_key(db: bytes, key: bytes) -> str:
    """A database and key as a message names them (control characters escaped)."""
    try:
        if db == fmt.DB_CHECKPOINTS:
            what = f"checkpoint {fmt.CKPT_KEY.unpack(key)[0]}"
        elif db == fmt.DB_MANIFESTS:
            what = "checkpoint {} buffer #{}".format(*fmt.MANIFEST_KEY.unpack(key))
        elif db == fmt.DB_CHUNKS:
            what = f"chunk {key.hex()[:16]}…"
        else:
            what = repr(key)
    except struct.error:
        what = repr(key)
    return f"{db.decode()}[{what}]"


def _read_version(txn: lmdb.Transaction, meta_db) -> int | None:
    """The format of the index in this snapshot from META_FORMAT (None: a new, empty index).
    Raises FormatError for a format newer than this library's, CorruptionError for damage."""
    raw = txn.get(fmt.META_FORMAT, db=meta_db)
    if raw is None:
        return None
    if len(raw) < fmt.U64.size:
        raise damaged(f"index value {describe_key(fmt.DB_META, fmt.META_FORMAT)} is too short")
    (claimed,) = fmt.U64.unpack_from(raw)
    if len(raw) == fmt.U64.size:                # format 1: the bare version, no checksum
        if claimed > fmt.FORMAT_VERSION:
            raise _newer(claimed)
        if claimed < fmt.MIN_FORMAT_VERSION or claimed >= fmt.INDEX_CHECKSUMS_SINCE:
            raise damaged(f"index value {describe_key(fmt.DB_META, fmt.META_FORMAT)} holds "
                          f"format {claimed} without a checksum")
        return claimed
    try:
        payload = unseal(fmt.DB_META, fmt.META_FORMAT, raw, fmt.FORMAT_VERSION)
    except CorruptionError:
        if claimed > fmt.FORMAT_VERSION:        # a newer format may seal differently
            raise _newer(claimed) from None
        raise
    if len(payload) != fmt.U64.size or claimed < fmt.INDEX_CHECKSUMS_SINCE:
        raise damaged(f"index value {describe_key(fmt.DB_META, fmt.META_FORMAT)} is invalid")
    if claimed > fmt.FORMAT_VERSION:
        raise _newer(claimed, verified=True)
    return claimed


def _newer(version: int, verified: bool = False) -> FormatError:
    """FormatError for an index of a newer format; verified: its version value passed this
    library's checksum (a newer format for certain, not a damaged value), as the attribute
    `verified_newer` tells (repair refuses to replace such an index)."""
    exc = FormatError(f"index was written by snapstore format {version}; this snapstore reads "
                      f"up to {fmt.FORMAT_VERSION}: upgrade snapstore")
    exc.verified_newer = verified
    return exc


# ---- the data file: never let LMDB touch a page past its end (that is a SIGBUS) ------------
def _check_data_file(index_path: str, rebuilding: bool) -> str:
    """Before LMDB opens it: data.mdb must be a regular file, and may be missing or empty
    (LMDB then starts a new, empty index) only while the store has no log yet, or when the
    caller is rebuilding the index from the log. Returns its path."""
    data = os.path.join(index_path, fmt.INDEX_DATA_FILE)
    try:
        st = os.lstat(data)           # a symlink is damage too: LMDB would follow it
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StoreIOError(f"cannot stat the index file {data}: {exc.strerror}", exc.errno) \
            from exc
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise damaged(f"the index file {data} is {file_kind(st.st_mode)}, not a regular file")
    if (st is None or st.st_size == 0) and not rebuilding and _log_exists(index_path):
        raise damaged(f"the index file {data} is missing or empty but the log holds records")
    return data


def _check_index_files(path: str, rebuilding: bool) -> None:
    """The index directory at path (or, mid-swap, the one that replaces it) and its data file
    are there, or may be missing (_check_data_file). A compaction's swap in another process
    takes index/ away for a moment where the file system cannot exchange directories (two
    renames): a missing index is looked for again a few times before it is reported."""
    for last in indexswap.looks_across_a_swap():
        location = indexswap.index_to_read(path)
        try:
            if not os.path.isdir(location):
                raise FormatError(f"no index at {path}; not a snapstore store")
            _check_data_file(location, rebuilding)
            return
        except (FormatError, CorruptionError):
            if last:
                raise


def _log_exists(index_path: str) -> bool:
    """Whether the store that holds this index directory has a segment file with records."""
    segments = os.path.join(os.path.dirname(os.path.abspath(index_path)), fmt.SEGMENTS_DIR)
    try:
        names = [n for n in os.listdir(segments) if n.endswith(fmt.SEGMENT_SUFFIX)]
    except OSError:
        return False
    for name in names:
        try:
            if os.stat(os.path.join(segments, name)).st_size > fmt.SEGMENT_HEADER.size:
                return True
        except OSError:
            return True                 # there, but unreadable: not an empty log
    return False


def _check_not_truncated(env: lmdb.Environment, data: str) -> None:
    """LMDB maps the file and reads pages up to its last page in place: past the end of the
    file that is SIGBUS. So the file must reach the end of LMDB's last page. (A file too short
    for LMDB's two meta pages already failed lmdb.open with MDB_INVALID.)"""
    with lmdb_errors("open"):
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    try:
        st = os.stat(data)
    except FileNotFoundError:
        return      # a swap's rename moved it meanwhile: env's file is another (see below)
    except OSError as exc:
        raise StoreIOError(f"cannot stat the index file {data}: {exc.strerror}", exc.errno) \
            from exc
    opened = _IDENTS.get(id(env))
    if opened is not None and opened != (st.st_dev, st.st_ino):
        return      # compaction swapped the index since env opened it: the file at `data` is
                    # not the one env maps (env's was whole; the Index moves to the new one)
    size = st.st_size
    if size < need:
        raise damaged(f"the index file {data} is truncated: it has {size} bytes, LMDB's last "
                      f"page ends at byte {need}")


class ChunkEntry(NamedTuple):
    """Where a chunk's record is and how many extents use it (plus, format 5, how many delta
    chunks name it as their base). A named tuple: a restore makes one per chunk, and a frozen
    dataclass costs several times more to build. base: a delta chunk's base chunk id, else
    None. Derive a moved or recounted entry with _replace(), which keeps the base."""
    segment: int
    offset: int
    stored_len: int
    raw_len: int
    refs: int
    codec: int
    base: bytes | None = None

    def pack(self) -> bytes:
        head = fmt.CHUNK_ENTRY.pack(*self[:6])
        return head if self.base is None else head + self.base

    @classmethod
    def unpack(cls, data: bytes) -> "ChunkEntry":
        if len(data) == fmt.CHUNK_ENTRY.size:
            return cls(*fmt.CHUNK_ENTRY.unpack(data))
        head = fmt.CHUNK_ENTRY.unpack_from(data)
        return cls(*head, bytes(data[fmt.CHUNK_ENTRY.size:]))


CHUNK_ENTRY_SIZES = (fmt.CHUNK_ENTRY.size, fmt.CHUNK_ENTRY.size + fmt.CHUNK_ID_BYTES)


_unpack_entry = fmt.CHUNK_ENTRY.unpack
_new_entry = tuple.__new__
_PLAIN_ENTRY_BYTES = fmt.CHUNK_ENTRY.size


def checked_chunk_entry(chunk_id: bytes, payload: bytes) -> ChunkEntry:
    """The chunk entry an index value holds (unsealed). Raises CorruptionError unless it has
    a chunk entry's length and a base exactly when it is a delta chunk's."""
    if len(payload) == _PLAIN_ENTRY_BYTES:      # the common case, written out: a restore
        fields = _unpack_entry(payload)         # looks up one entry per chunk
        if fields[5] != fmt.CODEC_DELTA_PLANES:
            return _new_entry(ChunkEntry, fields + (None,))
    if len(payload) not in CHUNK_ENTRY_SIZES:
        raise damaged(f"index value {describe_key(fmt.DB_CHUNKS, chunk_id)} has "
                      f"{len(payload)} bytes, not {fmt.CHUNK_ENTRY.size}")
    entry = ChunkEntry.unpack(payload)
    if (entry.codec == fmt.CODEC_DELTA_PLANES) != (entry.base is not None):
        raise damaged(f"index value {describe_key(fmt.DB_CHUNKS, chunk_id)}: "
                      + ("a delta chunk without its base" if entry.base is None
                         else "a base for a chunk that is not a delta chunk"))
    return entry


def _count_refs(blob: bytes, delta: int, counts: dict) -> dict:
    """Adds delta to counts[chunk id] for every extent of a packed manifest; returns counts."""
    for _, _, _, cid in fmt.EXTENT.iter_unpack(blob):
        counts[cid] = counts.get(cid, 0) + delta
    return counts


# Small tables whose point lookups that miss are confirmed by a walk (IndexView._confirm_absent):
# the store's counters and positions, where an absent key means a default.
_CONFIRMED_MISSES = frozenset({fmt.DB_META, fmt.DB_LOGS})


def _stream_key(stream: str, tail: bytes = b"") -> bytes:
    return stream.encode() + b"\0" + tail


# The identity (st_dev, st_ino) of the data file each open environment opened, by id(env).
# Compaction may replace the index directory by a compacted copy (indexswap.py): an
# environment whose path now holds another data file is outdated.
_IDENTS: dict[int, tuple[int, int] | None] = {}
# The data file each open environment stands for, by id(env): the one in its index directory
# (STORE/index/data.mdb), also when it was opened from a complete new index still waiting in
# .index.new for the second rename of a swap (indexswap.index_to_read).
_WATCHED: dict[int, str] = {}
# The directory each open environment was opened from, by id(env) (env.path() cannot give a
# path that is not valid UTF-8: LMDB is handed os.fsencode()d bytes, see open_env).
_OPENED_FROM: dict[int, str] = {}
# The environments opened without syncs (its first opener's durability, which holds while it
# is shared), by id(env): a durable Index sharing one syncs after each write itself.
_UNSYNCED: set[int] = set()


def _file_ident(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a file, None if it cannot be stat()ed (missing, mid-swap)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _file_size(path: str) -> int:
    """A file's size, 0 if it cannot be stat()ed."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _env_is_current(env: lmdb.Environment) -> bool:
    """Whether env's directory still holds the data file env opened (True when that cannot
    be told: a missing file is the moment of a fallback swap, not a replacement)."""
    watched = _WATCHED.get(id(env)) or os.path.join(_OPENED_FROM[id(env)],
                                                    fmt.INDEX_DATA_FILE)
    now = _file_ident(watched)
    return now is None or now == _IDENTS.get(id(env))


def _close_env(env: lmdb.Environment) -> None:
    _IDENTS.pop(id(env), None)
    _WATCHED.pop(id(env), None)
    _OPENED_FROM.pop(id(env), None)
    _UNSYNCED.discard(id(env))
    env.close()


# One lmdb.Environment per store directory per process: LMDB forbids opening the same
# environment twice in one process (closing one would drop the other's locks). A fork()ed
# child forgets its parent's (registry.SharedByPath), never using nor closing them. Once the
# directory holds a replaced index, the next acquire opens the new one; the old one is closed
# when its last Index lets go of it.
_ENVS: SharedByPath[lmdb.Environment] = SharedByPath(close=_close_env,
                                                     is_current=_env_is_current)


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


def lock_table_mode(file_mode: int) -> int:
    """The mode of a new reader table (lock.mdb): the store's file mode plus write for every
    class it lets read. Every reader of an LMDB environment registers in its reader table,
    read-only ones too, so a group that may read the store must be able to write this one
    file (`chmod -R g+rX STORE` shared a store with nobody: its readers got EACCES)."""
    return file_mode | ((file_mode & 0o044) >> 1)


def _grant_reader_table(fd: int, st: os.stat_result, mode: int) -> None:
    """Adds the bits of `mode` a reader table of ours lacks (the umask took them at its
    creation; without them the group the store is shared with cannot read it). Not ours
    (another user's store): left as it is."""
    missing = mode & ~stat.S_IMODE(st.st_mode)
    if missing and st.st_uid == os.geteuid():
        try:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | missing)
        except OSError:
            pass                    # a reader then gets the error naming the fix


def _check_reader_table_writable(location: str, path: str) -> None:
    """StoreIOError naming the fix when this user may read the index but not register as its
    reader (LMDB would fail with a bare EACCES)."""
    table = os.path.join(location, fmt.INDEX_LOCK_TABLE_FILE)
    if os.statvfs(location).f_flag & os.ST_RDONLY:
        return                      # read-only media: LMDB reads without registering
    if os.path.exists(table) and not os.access(table, os.W_OK):
        where = os.path.join(path, fmt.INDEX_LOCK_TABLE_FILE)
        raise StoreIOError(
            f"cannot read the store: its index's reader table {where} is not writable for "
            "this user, and LMDB registers every reader in it (read-only ones too). To share "
            "a store with a group: chmod -R g+rX STORE && chmod g+w STORE/index/lock.mdb "
            "(later reader tables get it by themselves)")


def reserve_lock_table(location: str, file_mode: int) -> None:
    """Gives LMDB's reader table (lock.mdb) real disk blocks before LMDB maps it: LMDB sizes
    a new one with ftruncate (a hole) and writes it through its memory map, and a write into
    a hole on a full file system is a SIGBUS, which kills the process, where this allocation
    fails with ENOSPC (StoreIOError). A new or empty table gets INDEX_LOCK_TABLE_BYTES (LMDB
    takes a bigger file as room for more readers); an existing one only has its own length
    allocated (never grown: processes that have it open sized their reader slots by it)."""
    name = os.path.join(location, fmt.INDEX_LOCK_TABLE_FILE)
    mode = lock_table_mode(file_mode)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    except PermissionError:
        return                      # a reader of someone else's store: LMDB decides
    except OSError as exc:
        raise StoreIOError(f"cannot open the index's reader table {name}: "
                           f"{os.strerror(exc.errno) if exc.errno else exc}") from None
    try:
        st = os.fstat(fd)
        _grant_reader_table(fd, st, mode)
        size = st.st_size
        os.posix_fallocate(fd, 0, size or fmt.INDEX_LOCK_TABLE_BYTES)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise StoreIOError(f"cannot reserve the index's reader table {name}: "
                               + ("disk full" if exc.errno == errno.ENOSPC
                                  else os.strerror(exc.errno) if exc.errno else str(exc))) \
                from None
    finally:
        os.close(fd)


def _acquire_env(path: str, durable: bool, file_mode: int) -> lmdb.Environment:
    """The process's environment of one store. Opened writable whenever the directory allows
    (read-only Stores never begin write transactions), so readers and a writer of the same
    store can share it in either order; read-only only on read-only file systems. The first
    opener's durability holds while it is shared (a durable Index syncs an environment opened
    without syncs after each of its writes: Index.write). New LMDB files get permission bits
    file_mode. Its files must be regular files (CorruptionError otherwise: LMDB would block
    on a FIFO, or write its lock table into whatever a symlink names)."""
    def open_env(real_path: str) -> lmdb.Environment:
        for _ in range(_OPEN_ATTEMPTS):
            location = indexswap.index_to_read(real_path)
            for name in (fmt.INDEX_DATA_FILE, fmt.INDEX_LOCK_TABLE_FILE):
                try:
                    check_regular(os.path.join(location, name))
                except NotRegularFile as exc:
                    raise CorruptionError(f"index file {os.path.join(path, name)} is "
                                          f"{exc.kind}, not a regular file: the index is "
                                          "damaged (rebuild it with `snapstore repair`)") \
                        from None
            fs_readonly = not os.access(location, os.W_OK)
            data = os.path.join(location, fmt.INDEX_DATA_FILE)
            before = _file_ident(data)
            if location != real_path and before is None:
                continue                # the second rename came first: index/ is back
            # In .index.new (a swap between its two renames) never open an empty data file:
            # LMDB initialises one it opens writable, and after the second rename .index.new
            # may already hold the next swap's copy, just created (0 bytes); writing meta
            # pages into it made the next index empty (every checkpoint gone). The complete
            # copy a swap renames is never empty: look again.
            fallback = location != real_path
            if fallback and _file_size(data) == 0:
                continue
            try:
                if not fs_readonly:
                    reserve_lock_table(location, file_mode)
                else:
                    _check_reader_table_writable(location, path)
                # bytes: a str path LMDB would encode as UTF-8, which fails for a name that
                # is not (os.fsencode gives back the bytes the file system holds)
                env = lmdb.open(os.fsencode(location), map_size=fmt.INDEX_MAP_SIZE, subdir=True,
                                max_dbs=fmt.INDEX_MAX_DBS, readonly=fs_readonly,
                                create=False, sync=durable, metasync=False, readahead=False,
                                lock=True, mode=file_mode)
            except (lmdb.Error, OSError) as exc:
                # a swap's rename took the directory away meanwhile (ENOENT): look again
                if indexswap.index_to_read(real_path) != location or \
                        _file_ident(data) != before:
                    continue
                if isinstance(exc, lmdb.Error):
                    raise _wrap(exc, "open") from exc
                raise
            after = _file_ident(data)
            if fallback and os.path.lexists(real_path):
                # opened in .index.new between a swap's two renames, but the second came
                # meanwhile: .index.new may hold the next swap's copy, still being written
                env.close()
                continue
            if before is None or before == after:   # the file it opened is `after`
                _IDENTS[id(env)] = after
                _WATCHED[id(env)] = os.path.join(real_path, fmt.INDEX_DATA_FILE)
                _OPENED_FROM[id(env)] = location
                if not durable:
                    _UNSYNCED.add(id(env))
                return env
            env.close()                 # swapped while opening: which one is unknown
        raise StoreIOError(f"the index at {path} was replaced {_OPEN_ATTEMPTS} times while "
                           "it was being opened")

    return _ENVS.acquire(path, open_env)


_OPEN_ATTEMPTS = 10


@contextlib.contextmanager
def _forked_safe(txn: lmdb.Transaction) -> Iterator[lmdb.Transaction]:
    """txn for a with block, ended as py-lmdb's own `with` ends it (committed when the
    block ends normally, aborted on an exception), by the process that began it only. A
    fork()ed child that ends the block (its copy of a generator holding it, closed as the
    child exits) must not: LMDB marks the reader slot in the shared lock file free, which is
    the parent's, so the parent's writer would recycle pages the parent's snapshot is still
    reading. The child's copy is kept alive forever instead (deallocating it would abort
    it too)."""
    pid = os.getpid()
    try:
        yield txn
    except BaseException:
        _end(txn, pid, commit=False)
        raise
    _end(txn, pid, commit=True)


def _end(txn: lmdb.Transaction, pid: int, commit: bool) -> None:
    if os.getpid() != pid:
        _CHILD_KEEPS.append(txn)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(txn))       # never deallocated
    elif commit:
        txn.commit()
    else:
        txn.abort()


_CHILD_KEEPS: list = []


@contextlib.contextmanager
def begin_write(env: lmdb.Environment, gate: WriterGate, timeout: float,
                **kwargs) -> Iterator[lmdb.Transaction]:
    """env.begin(write=True, **kwargs) inside the store's writer gate (writegate.py), which
    is held until the block ends: the caller commits or aborts the transaction in it (one
    still open at the end is aborted). timeout: how long a holder that is stopped is waited
    for (the store's)."""
    with gate.held(timeout):
        pid = os.getpid()
        txn = env.begin(write=True, **kwargs)
        try:
            yield txn
        finally:
            _end(txn, pid, commit=False)    # no-op once committed or aborted; a fork()ed
                                            # child's copy is kept (_forked_safe)


def _open_db(env: lmdb.Environment, name: bytes, txn: lmdb.Transaction | None = None):
    """An existing database of the environment; None for one that an index of an older
    format lacks (fmt.INDEX_DBS_SINCE: read as empty). Raises lmdb.NotFoundError for a
    database every index has."""
    try:
        if txn is None:
            return env.open_db(name, create=False)
        return env.open_db(name, txn=txn, create=False)
    except lmdb.NotFoundError:
        if name in fmt.INDEX_DBS_SINCE:
            return None
        raise


def _check_named_databases(txn: lmdb.Transaction, path: str) -> None:
    """Before a writer's open creates the databases an index lacks: the environment's main
    table must list either none (a new index) or every database of an index (but those
    fmt.INDEX_DBS_SINCE names, which an older format lacks), and nothing else. A flipped bit
    in a database's name there ("groups" -> "'roups") put the names out of order, so the
    lookups of the others missed: the writer created new, empty tables, and every
    checkpoint of the store read as never taken."""
    with txn.cursor() as cur:
        names = [bytes(k) for k in cur.iternext(values=False)]
    if not names:
        return
    known = set(fmt.INDEX_DBS)
    strange = [n for n in names if n not in known]
    missing = [n for n in fmt.INDEX_DBS if n not in names and n not in fmt.INDEX_DBS_SINCE]
    if strange or missing or names != sorted(names):
        what = (f"names {[n.decode('ascii', 'replace') for n in strange]!r}" if strange else
                f"lacks {[n.decode() for n in missing]!r}" if missing else "is out of order")
        raise damaged(f"index at {path}: its table of databases {what} (a damaged LMDB page)")


def open_in_process(path: str) -> bool:
    """Whether this process has the index at `path` open (through any Store)."""
    return _ENVS.users(path) > 0


class CheckedManifests:
    """The extents of recently read manifests that passed extents.check_manifest, so a read
    that resolves the same chain again (every read() of a range does) skips unpacking and
    checking them; bounded by their total number of extents (LRU), thread-safe.

    Keyed by (manifest key, the payload's verified checksum, buffer size, base): a manifest
    rewritten under the same key (delete, fold, trim) has another payload, so another
    checksum; that two payloads of one key share an XXH3-64 is the same 2^-64 chance the
    checksum itself rests on. Format 1 manifests have no checksum and are not kept."""

    LIMIT = 1 << 16                      # extents (~200 bytes each as Python tuples)

    def __init__(self) -> None:
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._extents = 0
        self._lock = threading.Lock()

    def get(self, memo: tuple) -> tuple | None:
        with self._lock:
            hit = self._entries.get(memo)
            if hit is not None:
                self._entries.move_to_end(memo)
            return hit

    def put(self, memo: tuple, extents: tuple) -> None:
        if len(extents) > self.LIMIT:
            return
        with self._lock:
            if memo in self._entries:
                return
            self._entries[memo] = extents
            self._extents += len(extents)
            while self._extents > self.LIMIT:
                _, old = self._entries.popitem(last=False)
                self._extents -= len(old)


# How often an Index looks whether its directory holds a replaced index (see Index._enter):
# at every transaction. With many writer processes a Store that went on reading a replaced
# index for a while would miss checkpoints other processes acknowledged since (issue 16: a
# group's participants missed the parent their coordinator had just committed); the stat
# costs about 1.5 us per transaction. Tests raise it to pin an interleaving. And how many
# times an Index of this process moved to a replaced one.
RECHECK_SECONDS = 0.0
_MOVES = [0]


class _Opened:
    """One LMDB environment of the index as an Index uses it: its databases, and how many
    transactions of that Index are open in it. Once the index directory was replaced
    (compaction's shrink, repair) the Index moves to a new _Opened and retires this one,
    which lets go of its environment when its last transaction ends."""

    __slots__ = ("env", "dbs", "txns", "retired")

    def __init__(self, env: lmdb.Environment, dbs: dict) -> None:
        self.env, self.dbs, self.txns, self.retired = env, dbs, 0, False


class Index:
    """The open index of one store.

    rebuilding=True is for rebuilding the index from the log (`snapstore repair`): a missing
    or empty data file is then expected, not damage.

    A replaced index: when the directory at `path` holds another data file than the one this
    Index opened (indexswap.swap_in swapped a compacted copy or a rebuilt index in; in this
    process or another), the next transaction opens the new one, and the old environment is
    closed once no transaction of this Index uses it. So no transaction begins in a replaced
    index (each looks: RECHECK_SECONDS), and a transaction under way keeps the snapshot it began with, which
    stays consistent (the old file lives until closed)."""

    def __init__(self, path: str, *, readonly: bool, durable: bool,
                 file_mode: int = DEFAULT_FILE_MODE, rebuilding: bool = False,
                 new_version: int = fmt.FORMAT_VERSION, timeout: float = math.inf) -> None:
        self.path = path
        self.timeout = timeout          # for a stopped holder of the write lock (writegate)
        self.gate = writer_gate(path, file_mode)
        self.readonly = readonly
        self.durable = durable
        self.file_mode = file_mode
        self.checked_manifests = CheckedManifests()
        self._lock = threading.Lock()
        self._opened: _Opened | None = None
        self._seen_moves, self._checked_at = _MOVES[0], time.monotonic()
        _check_index_files(path, rebuilding)
        self._data = os.path.join(path, fmt.INDEX_DATA_FILE)   # watched for replacements
        self._opened = self._open(create=not readonly)
        try:
            self.version = self._check_version(new_version)
        except BaseException:
            self.close()
            raise

    def _open(self, create: bool) -> _Opened:
        """The environment at path (shared in the process), checked, with its databases.
        create=True creates missing databases (a writer's first open)."""
        env = _acquire_env(self.path, self.durable, self.file_mode)
        try:
            _check_not_truncated(env, self._data_file(env))
            with lmdb_errors("open databases", self.path):
                with env.begin() as txn:
                    _check_named_databases(txn, self.path)
                if env.flags()["readonly"]:     # no writer can be in this process
                    dbs = {name: _open_db(env, name) for name in fmt.INDEX_DBS}
                elif not create:
                    # a reader (or a move to a replaced index): an older index lacks the
                    # newer databases (None: read as empty); see the comment below
                    with begin_write(env, self.gate, self.timeout) as txn:
                        dbs = {name: _open_db(env, name, txn) for name in fmt.INDEX_DBS}
                        txn.commit()
                else:
                    # an explicit write transaction: begin() lets go of the GIL while it waits
                    # for LMDB's writer mutex, open_db's own does not (a writer thread
                    # holding the mutex would wait for the GIL forever); read transactions
                    # cannot open databases for later ones in py-lmdb
                    with begin_write(env, self.gate, self.timeout) as txn:
                        dbs = {name: env.open_db(name, txn=txn, create=create)
                               for name in fmt.INDEX_DBS}
                        txn.commit()
        except (lmdb.NotFoundError, KeyError) as exc:
            _ENVS.release(env)
            raise FormatError(f"index at {self.path} is missing databases; not a snapstore "
                              "store or not initialised") from exc
        except BaseException:
            _ENVS.release(env)
            raise
        return _Opened(env, dbs)

    def _data_file(self, env: lmdb.Environment) -> str:
        """The data file's path: in index/, or where env opened it while index/ is missing
        (a reader between the two renames of a swap: indexswap.index_to_read)."""
        if os.path.lexists(self._data):
            return self._data
        return os.path.join(_OPENED_FROM[id(env)], fmt.INDEX_DATA_FILE)

    @property
    def env(self) -> lmdb.Environment:
        """The current environment (None once closed)."""
        opened = self._opened
        return opened.env if opened is not None else None

    @property
    def dbs(self) -> dict:
        return self._opened.dbs

    def _check_version(self, new_version: int) -> int:
        """The index's format. Refuses an index written by a newer format (readers too);
        stamps a new one with new_version (this library's, or the oldest format that reads
        what it will hold: an S3 store's cache)."""
        with self.read() as r:
            version = _read_version(r.txn, r.dbs[fmt.DB_META])
        if version is None and not self.readonly:
            with self.write() as w:
                w.set_format(new_version)
            return new_version
        return fmt.FORMAT_VERSION if version is None else version

    def add_value_checksums(self) -> bool:
        """The index step of the upgrade to format 2 (upgrade.py): in one write transaction,
        seals every value of every database with its checksum and sets META_FORMAT to 2.
        All or nothing, so a crash leaves format 1 to upgrade again; returns False, doing
        nothing, when the index already is format 2 or later."""
        with self._txn(write=True, what="upgrade") as (txn, dbs):
            version = _read_version(txn, dbs[fmt.DB_META])
            if version is None or version >= fmt.INDEX_CHECKSUMS_SINCE:
                return False
            for name in fmt.INDEX_DBS:
                with txn.cursor(db=dbs[name]) as cur:
                    for key, value in cur:
                        cur.put(key, seal(name, key, value))
            txn.put(fmt.META_FORMAT, seal(fmt.DB_META, fmt.META_FORMAT,
                                          fmt.U64.pack(fmt.INDEX_CHECKSUMS_SINCE)),
                    db=dbs[fmt.DB_META])
            crashpoint("upgrade_before_index_commit")
        self.version = fmt.INDEX_CHECKSUMS_SINCE
        return True

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, None
            if opened is not None:
                opened.retired = True
                if opened.txns == 0:
                    _ENVS.release(opened.env)

    # -- transactions: each in the current environment
    def _enter(self) -> _Opened:
        """The _Opened a transaction begins in (one more transaction counted): the current
        one, or a new one if the directory now holds a replaced index. Whether it does is
        looked at (a stat, about 1.5 microseconds) at every transaction (RECHECK_SECONDS 0),
        so a replacement by another process is noticed at once."""
        now = time.monotonic()
        current = None
        if self._seen_moves != _MOVES[0] or now - self._checked_at >= RECHECK_SECONDS:
            self._seen_moves, self._checked_at = _MOVES[0], now
            current = _file_ident(self._data)
        with self._lock:
            opened = self._opened
            if opened is None:
                raise StoreIOError(f"the index at {self.path} is closed")
            if current is not None and current != _IDENTS.get(id(opened.env)):
                opened = self._reopen(opened)
            opened.txns += 1
            return opened

    def refresh(self) -> None:
        """Moves to a replaced index now (the one that replaced it calls this)."""
        self._checked_at = float("-inf")
        self._leave(self._enter())

    def _reopen(self, old: _Opened) -> _Opened:
        """Moves to the index now at path (lock held); the old environment is let go of once
        its last transaction ends. If the new one does not open, the old one stays. Its
        databases exist (a replacement is a complete index)."""
        new = self._open(create=False)
        old.retired = True
        if old.txns == 0:
            _ENVS.release(old.env)
        self._opened = new
        self.checked_manifests = CheckedManifests()
        _MOVES[0] += 1                  # the other Indexes of the process look at once
        return new

    def _leave(self, opened: _Opened) -> None:
        with self._lock:
            opened.txns -= 1
            if opened.retired and opened.txns == 0:
                _ENVS.release(opened.env)

    @contextlib.contextmanager
    def _txn(self, *, write: bool, what: str) -> Iterator[tuple]:
        opened = self._enter()
        try:
            with lmdb_errors(what, self.path):
                with _forked_safe(opened.env.begin(write=write, buffers=False)) as txn:
                    yield txn, opened.dbs
        finally:
            self._leave(opened)

    @contextlib.contextmanager
    def read(self) -> Iterator["IndexView"]:
        # _txn written out: every restore and read begins one
        opened = self._enter()
        try:
            with lmdb_errors("read"):
                with _forked_safe(opened.env.begin(buffers=False)) as txn:
                    yield IndexView(self, txn, opened.dbs)
        finally:
            self._leave(opened)

    @contextlib.contextmanager
    def write(self, *, rebuilding: bool = False) -> Iterator["IndexWriter"]:
        """A write transaction. rebuilding=True (repair.py only): reference counts are not
        maintained (the rebuild recounts them at the end), so a manifest may name a chunk the
        index lacks (the rebuild reports it).

        With many writer processes, compaction may replace the index by a compacting copy
        while other processes still have the old one open: it holds the old environment's
        write lock from the copy until the swap is done. So once this transaction holds an
        environment's write lock, the data file it opened is checked to still be the one at
        the index's path; if not, the transaction is dropped unwritten and begun again in the
        new index, so no write ever lands in a replaced index."""
        for _ in range(_OPEN_ATTEMPTS):
            opened = self._enter()
            try:
                with lmdb_errors("write", self.path):
                    with begin_write(opened.env, self.gate, self.timeout,
                                     buffers=False) as txn:
                        now = _file_ident(self._data)
                        if now is not None and now != _IDENTS.get(id(opened.env)):
                            self._checked_at = float("-inf")    # move at the next _enter
                            continue                            # (begin_write aborts it)
                        yield IndexWriter(self, txn, opened.dbs, rebuilding=rebuilding)
                        txn.commit()
                    if self.durable and id(opened.env) in _UNSYNCED:
                        opened.env.sync(True)   # another Index opened it without syncs
                    return
            finally:
                self._leave(opened)
        raise StoreIOError(f"the index at {self.path} was replaced {_OPEN_ATTEMPTS} times "
                           "while a transaction waited for it")

    def sync(self) -> None:
        """Forces every committed transaction to disk (even with durability "none")."""
        opened = self._enter()
        try:
            with lmdb_errors("sync", self.path):
                opened.env.sync(True)
        finally:
            self._leave(opened)

    def disk_bytes(self) -> int:
        """The bytes of the index's files (data.mdb and lock.mdb): what it occupies."""
        total = 0
        for name in (fmt.INDEX_DATA_FILE, fmt.INDEX_LOCK_TABLE_FILE):
            try:
                total += os.stat(os.path.join(self.path, name)).st_size
            except OSError:
                pass
        return total

    def space(self) -> tuple[int, int]:
        """(bytes of the data file, bytes of the pages in use: both meta pages and every page
        of every database). The rest is LMDB's free pages, which it reuses but never gives
        back to the file system: only a compacting copy (copy_compacted) does."""
        with self._txn(write=False, what="stat") as (txn, dbs):
            psize = txn.stat(dbs[fmt.DB_META])["psize"]
            stats = [txn.stat(db) for db in dbs.values()]
            with lmdb_errors("stat"):
                main = self.env.stat()
        used = 2 + sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                       for st in [main, *stats])
        data = self._data_file(self.env)
        try:
            size = os.stat(data).st_size
        except OSError as exc:
            raise StoreIOError(f"cannot stat the index file {data}: {exc.strerror}",
                               exc.errno) from exc
        return size, used * psize

    def copy_compacted(self, dest: str, then: Callable[[], None] | None = None) -> bool:
        """Writes a compacting copy of the index (only the pages in use, renumbered) into the
        empty directory dest and makes it durable (the file and dest's entry), whatever the
        store's durability; then runs then() (compaction swaps the copy in there) while no
        write can have happened since the copy: the index's write lock is held for the copy
        (from memory: quick), let go while the copy is synced (the slow part, which writers
        of other processes must not wait for), and held again for then(), which runs only
        if LMDB's last transaction is still the one the copy holds (Index.write: a writer
        then waiting moves to the new index). If writers committed meanwhile the copy is
        made again, up to _COPY_ATTEMPTS times. Returns whether then() ran."""
        data = os.path.join(dest, fmt.INDEX_DATA_FILE)
        for _ in range(_COPY_ATTEMPTS):
            for name in os.listdir(dest):
                os.unlink(os.path.join(dest, name))
            opened = self._enter()
            try:
                with lmdb_errors("copy", self.path):
                    with begin_write(opened.env, self.gate,     # keeps every writer out
                                     self.timeout):
                        copied = opened.env.info()["last_txnid"]
                        opened.env.copy(os.fsencode(dest), compact=True)
                    fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fchmod(fd, self.file_mode)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    with begin_write(opened.env, self.gate, self.timeout):
                        if opened.env.info()["last_txnid"] != copied:
                            continue                        # written meanwhile: copy again
                        if then is not None:
                            then()
                        return True
            finally:
                self._leave(opened)
        return False


_COPY_ATTEMPTS = 3


class IndexView:
    """Read access inside one LMDB transaction. Every value read is checked (unseal) against
    the format of this snapshot (`version`)."""

    def __init__(self, index: Index, txn: lmdb.Transaction, dbs: dict) -> None:
        self.index, self.txn, self.dbs = index, txn, dbs
        version = _read_version(txn, self.dbs[fmt.DB_META])
        self.version = fmt.FORMAT_VERSION if version is None else version
        self._walked: set[bytes] = set()     # tables _confirm_absent walked in this txn
        # decoded checkpoints of this snapshot that chain_checkpoint() gave out, and {buffer
        # name: position} of each: a restore of N buffers walks the same parent chain N times
        # (None: not kept, in a write transaction, whose records change)
        self._commits: dict[int, Commit] | None = {}
        self._positions: dict[int, tuple[Commit, dict]] = {}

    # -- the one way values are read
    def _get(self, db: bytes, key: bytes) -> bytes | None:
        """The checked payload stored under key, or None."""
        if self.dbs[db] is None:        # a database an index of an older format lacks
            return None
        value = self.txn.get(key, db=self.dbs[db])
        return None if value is None else unseal(db, key, value, self.version)

    def _confirm_absent(self, db: bytes, key: bytes) -> None:
        """A point lookup of `key` in `db` missed. LMDB checksums none of its pages, so one
        flipped bit in a stored key (or in a branch page that routes the search) hides an
        entry from lookups while the rest of the table reads fine; answering "no such
        checkpoint" then would report an acknowledged checkpoint as never taken. Before a
        miss counts, walk the table once per transaction: every entry's checksum (which
        covers its key, see seal) must hold, and the walk must not find `key` (if it does,
        the tree's search path is damaged). Only misses pay for this, and only in the small
        tables that name checkpoints and streams."""
        if db in self._walked:
            return
        walked = 0
        for k, _ in self._items(db):
            if k == key:
                raise damaged(f"index table {db.decode()!r} holds {describe_key(db, key)} but "
                              "a lookup does not find it (a damaged LMDB page)")
            walked += 1
        self._check_complete(db, walked)
        self._walked.add(db)

    def _check_complete(self, db: bytes, walked: int) -> None:
        """CorruptionError unless a walk of all of `db` found as many entries as the table
        counts (LMDB keeps the count in the table's root record): a flipped bit in a branch
        page can hide a whole subtree from walks and lookups alike, and its checkpoints would
        read as never taken."""
        entries = self.txn.stat(self.dbs[db])["entries"]
        if walked != entries:
            raise damaged(f"index table {db.decode()!r} counts {entries} entries but a walk "
                          f"finds {walked} (a damaged LMDB page hides the others)")

    def _items(self, db: bytes, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, checked payload) of the keys starting with prefix, in key order."""
        if self.dbs[db] is None:        # a database an index of an older format lacks
            return
        with self.txn.cursor(db=self.dbs[db]) as cur:
            if not cur.set_range(prefix):
                return
            for key, value in cur:
                if not key.startswith(prefix):
                    break
                yield key, unseal(db, key, value, self.version)

    @staticmethod
    def _decode(db: bytes, key: bytes, payload: bytes, decode: Callable):
        """decode(payload), with any failure to decode reported as index damage."""
        try:
            return decode(payload)
        except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise damaged(f"index value {describe_key(db, key)} does not decode: "
                          f"{exc!r}") from exc

    def _decoded(self, db: bytes, key: bytes, decode: Callable):
        payload = self._get(db, key)
        if payload is None:
            if db in _CONFIRMED_MISSES:
                # an absent counter reads as its default (next_id 1...): a flipped bit in its
                # stored key must be damage, not a fresh start (a checkpoint got id 1 again)
                self._confirm_absent(db, key)
            return None
        return self._decode(db, key, payload, decode)

    # -- meta
    def applied(self) -> tuple[int, int] | None:
        """Where log 0 (the one log of a format <= 2 store) is applied up to: log_applied(0)."""
        return self.log_applied(0)

    def log_applied(self, log: int) -> tuple[int, int] | None:
        """The log position just past the last record of log `log` the index has applied
        (None: none yet). Format <= 2 indexes keep log 0's in META_APPLIED."""
        pos = self._decoded(fmt.DB_LOGS, fmt.LOG_KEY.pack(log), fmt.LOG_POSITION.unpack)
        if pos is None and log == 0:
            pos = self._decoded(fmt.DB_META, fmt.META_APPLIED, fmt.LOG_POSITION.unpack)
        return pos

    def logs(self) -> dict[int, tuple[int, int]]:
        """{log: applied position} of every log the index knows."""
        out = {self._decode(fmt.DB_LOGS, k, k, lambda v: fmt.LOG_KEY.unpack(v)[0]):
               self._decode(fmt.DB_LOGS, k, v, fmt.LOG_POSITION.unpack)
               for k, v in self._items(fmt.DB_LOGS)}
        if 0 not in out:
            legacy = self._decoded(fmt.DB_META, fmt.META_APPLIED, fmt.LOG_POSITION.unpack)
            if legacy is not None:
                out[0] = legacy
        return out

    def next_order(self) -> int:
        """The order the next claimed operation gets (format 3)."""
        v = self._decoded(fmt.DB_META, fmt.META_NEXT_ORDER, fmt.U64.unpack)
        return v[0] if v is not None else 1

    def gc_generation(self) -> int:
        """How many transactions deleted chunk entries so far (format 3)."""
        v = self._decoded(fmt.DB_META, fmt.META_GC_GENERATION, fmt.U64.unpack)
        return v[0] if v is not None else 0

    # -- operations in progress (claims.py, groups.py)
    def claims(self) -> list[tuple[int, dict, bytes]]:
        """[(order, claim, pinned chunk ids packed)] of every operation in progress."""
        return [(key_number(fmt.DB_CLAIMS, k, fmt.CLAIM_KEY),) +
                self._decode(fmt.DB_CLAIMS, k, v, _split_blob)
                for k, v in self._items(fmt.DB_CLAIMS)]

    def group_entries(self, prefix: bytes = b"") -> list[tuple[bytes, dict, bytes]]:
        """[(key, json, blob)] of the groups database under prefix, in key order."""
        return [(k,) + self._decode(fmt.DB_GROUPS, k, v, _split_blob)
                for k, v in self._items(fmt.DB_GROUPS, prefix)]

    def next_id(self) -> int:
        v = self._decoded(fmt.DB_META, fmt.META_NEXT_ID, fmt.U64.unpack)
        return v[0] if v is not None else 1

    def log_state(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """Where the newest durable state section of the log lies: (log position of its first
        record, log position just past its last); None when none was written."""
        v = self._decoded(fmt.DB_META, fmt.META_LOG_STATE, fmt.STATE_MARK.unpack)
        return None if v is None else ((v[0], v[1]), (v[2], v[3]))

    # -- chunks
    def chunk(self, chunk_id: bytes) -> ChunkEntry | None:
        # _decoded written out: a restore reads one chunk entry per chunk
        value = self.txn.get(chunk_id, db=self.dbs[fmt.DB_CHUNKS])
        if value is None:
            return None
        payload = unseal(fmt.DB_CHUNKS, chunk_id, value, self.version)
        return checked_chunk_entry(chunk_id, payload)

    def has_chunk(self, chunk_id: bytes) -> bool:
        return self.chunk(chunk_id) is not None

    def chunks(self) -> Iterator[tuple[bytes, ChunkEntry]]:
        for k, v in self._items(fmt.DB_CHUNKS):
            yield k, checked_chunk_entry(k, v)

    # -- checkpoints
    def checkpoint(self, checkpoint_id: int) -> Commit | None:
        """The checkpoint's record, or None if the index holds none (a miss is confirmed
        by _confirm_absent: damage raises CorruptionError, never reads as "no such id")."""
        key = fmt.CKPT_KEY.pack(checkpoint_id)
        commit = self._decoded(fmt.DB_CHECKPOINTS, key,
                               lambda v: Commit.from_info_json(json.loads(v)))
        if commit is None:
            self._confirm_absent(fmt.DB_CHECKPOINTS, key)
        return commit

    def chain_checkpoint(self, checkpoint_id: int, named_by: str) -> Commit:
        """named_checkpoint() for walking delta chains (reader.buffer_layers): in a read
        snapshot each record is decoded once and the same object given out again, so its
        callers must not change it (checkpoint() gives a fresh one)."""
        if self._commits is None:
            return self.named_checkpoint(checkpoint_id, named_by)
        commit = self._commits.get(checkpoint_id)
        if commit is None:
            commit = self._commits[checkpoint_id] = self.named_checkpoint(checkpoint_id,
                                                                         named_by)
        return commit

    def buffer_position(self, commit: Commit, name: str) -> int | None:
        """Where buffer `name` (a str) is in commit.buffers (the first, should a damaged
        record name one twice), or None."""
        if self._commits is None:
            return next((i for i, b in enumerate(commit.buffers) if b.name == name), None)
        known = self._positions.get(commit.id)
        if known is None or known[0] is not commit:
            positions: dict = {}
            for i, b in enumerate(commit.buffers):
                positions.setdefault(b.name, i)
            known = self._positions[commit.id] = (commit, positions)
        return known[1].get(name)

    def named_checkpoint(self, checkpoint_id: int, named_by: str) -> Commit:
        """A checkpoint the index itself names (a stream's head, a parent, a stream's list):
        its record must exist, so a missing one is index damage (CorruptionError)."""
        commit = self.checkpoint(checkpoint_id)
        if commit is None:
            raise CorruptionError(f"{named_by} names checkpoint {checkpoint_id}, which the "
                                  f"index does not hold: the index is damaged ({REPAIR_HINT}), "
                                  "or, when repair already reported that missing parent, its "
                                  "record is lost from the log")
        return commit

    def checkpoint_ids(self, stream: str | None = None) -> list[int]:
        if stream is None:
            with self.txn.cursor(db=self.dbs[fmt.DB_CHECKPOINTS]) as cur:
                ids = [key_number(fmt.DB_CHECKPOINTS, k) for k in cur.iternext(values=False)]
            self._check_complete(fmt.DB_CHECKPOINTS, len(ids))
            return ids
        # keys only: the ids are the keys, the values are empty, so a scan that skips the
        # values' checksums costs a tenth; an id a damaged key makes up names no checkpoint,
        # and whoever looks it up gets the index damage (named_checkpoint)
        prefix = _stream_key(stream)
        size = len(prefix) + fmt.CKPT_KEY.size
        unpack = fmt.CKPT_KEY.unpack_from
        ids = []
        with self.txn.cursor(db=self.dbs[fmt.DB_STREAM_CKPTS]) as cur:
            if cur.set_range(prefix):
                for key in cur.iternext(values=False):
                    if not key.startswith(prefix):
                        break
                    if len(key) != size:
                        raise damaged(f"index key {describe_key(fmt.DB_STREAM_CKPTS, key)} "
                                      "is not a stream's checkpoint key")
                    ids.append(unpack(key, len(prefix))[0])
        return ids

    def checkpoints_mentioning(self, text: str) -> Iterator[Commit]:
        """Every checkpoint whose record may hold the string `text` (as a tag, a stream, a meta
        value...), oldest first: a superset, for a scan by something not indexed. Records
        whose bytes cannot hold it (text printable ASCII without quote or backslash, which
        every JSON encoder writes as is) are skipped before decoding, which is most of the
        cost; otherwise every checkpoint is decoded. A skipped record's checksum is still
        checked (CorruptionError): damage that hid the text must not make a name find nothing,
        or only the other checkpoint of an ambiguous one."""
        plain = text.isascii() and text.isprintable() and '"' not in text and "\\" not in text
        needle = f'"{text}"'.encode() if plain else b""
        with self.txn.cursor(db=self.dbs[fmt.DB_CHECKPOINTS]) as cur:
            for key, value in cur:          # the search runs on the stored value, then checked
                payload = unseal(fmt.DB_CHECKPOINTS, key, value, self.version)
                if needle in value:
                    yield self._decode(fmt.DB_CHECKPOINTS, key, payload,
                                       lambda v: Commit.from_info_json(json.loads(v)))

    def last_checkpoint_id(self) -> int | None:
        """The highest checkpoint id in the index (the newest checkpoint), or None: one
        cursor step, not a scan."""
        with self.txn.cursor(db=self.dbs[fmt.DB_CHECKPOINTS]) as cur:
            return key_number(fmt.DB_CHECKPOINTS, cur.key()) if cur.last() else None

    def _stored_manifest(self, checkpoint_id: int, buffer_index: int) -> tuple[bytes, bytes]:
        """(key, value as stored) of one manifest; CorruptionError if the index lacks it."""
        key = fmt.MANIFEST_KEY.pack(checkpoint_id, buffer_index)
        value = self.txn.get(key, db=self.dbs[fmt.DB_MANIFESTS])
        if value is None:
            raise CorruptionError(f"index lacks manifest {buffer_index} of checkpoint "
                                  f"{checkpoint_id}")
        return key, value

    def manifest(self, checkpoint_id: int, buffer_index: int) -> bytes:
        """The packed extents of one buffer of a checkpoint (checksum checked)."""
        key, value = self._stored_manifest(checkpoint_id, buffer_index)
        return unseal(fmt.DB_MANIFESTS, key, value, self.version)

    def extents(self, commit: Commit, buffer_index: int) -> tuple:
        """The extents of buffer `buffer_index` of `commit` (an immutable sequence), checked
        to be a valid manifest of that buffer (extents.check_manifest) before anything uses
        them. A manifest already checked is taken from the index's CheckedManifests."""
        b = commit.buffers[buffer_index]
        key, value = self._stored_manifest(commit.id, buffer_index)
        blob = unseal(fmt.DB_MANIFESTS, key, value, self.version)
        memo = None
        if len(blob) < len(value):       # sealed: the verified checksum names the payload
            memo = (key, value[len(blob):], b.size, b.base)
            hit = self.index.checked_manifests.get(memo)
            if hit is not None:
                return hit
        try:
            out = tuple(ext.unpack(blob))
            ext.check_manifest(out, b.size, b.base == "full",
                               f"checkpoint {commit.id} buffer {b.name!r}")
        except CorruptionError as exc:
            raise damaged(str(exc)) from exc
        if memo is not None:
            self.index.checked_manifests.put(memo, out)
        return out

    def children(self, checkpoint_id: int) -> list[int]:
        prefix = fmt.CKPT_KEY.pack(checkpoint_id)
        return [key_number(fmt.DB_CHILDREN, k[len(prefix):])
                for k, _ in self._items(fmt.DB_CHILDREN, prefix)]

    # -- streams
    def streams(self) -> dict[str, int]:
        return {self._decode(fmt.DB_STREAMS, k, k, bytes.decode):
                self._decode(fmt.DB_STREAMS, k, v, lambda p: json.loads(p)["head"])
                for k, v in self._items(fmt.DB_STREAMS)}

    def _stream(self, stream: str) -> dict | None:
        record = self._decoded(fmt.DB_STREAMS, stream.encode(), _stream_json)
        if record is None:
            self._confirm_absent(fmt.DB_STREAMS, stream.encode())
        return record

    def stream_head(self, stream: str) -> int | None:
        s = self._stream(stream)
        return s["head"] if s is not None else None

    def stream_seq(self, stream: str) -> int:
        """The seq of the stream's newest checkpoint ever committed (0 for a new stream)."""
        return _record_seq(self._stream(stream))

    def stream_version(self, stream: str) -> tuple[int, int, int] | None:
        """(head, seq, number of checkpoints) of the stream, None when it has none: it changes
        whenever the stream gains a checkpoint (a greater seq) or loses one (a smaller count),
        so it tells a cache of the stream whether it is current without listing it. The count
        is kept in the stream's record ("n"); a record written before it was (an index of an
        older version) is counted by a key scan."""
        s = self._stream(stream)
        if s is None:
            return None
        return s["head"], _record_seq(s), self._stream_count(stream, s)

    def _stream_count(self, stream: str, record: dict | None) -> int:
        """The stream's number of checkpoints as its record (`_stream`) keeps it, counted by
        a key scan when the record predates the count or there is none."""
        n = record.get("n") if record is not None else None
        return n if isinstance(n, int) else len(self.checkpoint_ids(stream))

    def fingerprints(self, stream: str, buffer: str) -> tuple[int, int, bytes] | None:
        """(checkpoint id, page size, digests) recorded for a stream's buffer, or None."""
        def decode(v: bytes) -> tuple[int, int, bytes]:
            ckpt, page_size, _ = fmt.FP_HEADER.unpack_from(v)
            return ckpt, page_size, v[fmt.FP_HEADER.size:]
        return self._decoded(fmt.DB_FINGERPRINTS, _stream_key(stream, buffer.encode()), decode)


def _split_blob(payload: bytes) -> tuple[dict, bytes]:
    """(JSON object, the bytes after it) of a BLOB_HEADER + JSON + blob value."""
    (n,) = fmt.BLOB_HEADER.unpack_from(payload)
    start = fmt.BLOB_HEADER.size
    d = json.loads(payload[start:start + n])
    if not isinstance(d, dict) or start + n > len(payload):
        raise ValueError("not a JSON object with its blob")
    return d, bytes(payload[start + n:])


def join_blob(d: dict, blob: bytes = b"") -> bytes:
    """The value _split_blob reads back."""
    js = json.dumps(d, separators=(",", ":")).encode()
    return fmt.BLOB_HEADER.pack(len(js)) + js + blob


def _record_seq(record: dict | None) -> int:
    """The last seq a stream record (`IndexView._stream`) holds, 0 for none."""
    return record.get("seq", 0) if record is not None else 0


def _stream_json(payload: bytes) -> dict:
    d = json.loads(payload)
    if not isinstance(d, dict) or not isinstance(d["head"], int):
        raise ValueError("not a stream record")
    return d


class IndexWriter(IndexView):
    """Write access inside one LMDB write transaction (all or nothing). Every value it writes
    is sealed, so it refuses an index whose values are not: upgrade.py converts it first."""

    def __init__(self, index: Index, txn: lmdb.Transaction, dbs: dict, *,
                 rebuilding: bool = False) -> None:
        super().__init__(index, txn, dbs)
        self._commits = None        # nothing decoded is kept: see IndexView
        self.rebuilding = rebuilding
        if self.version < fmt.INDEX_CHECKSUMS_SINCE:
            raise FormatError(f"the index is format {self.version}; it must be upgraded "
                              "before it is written (a writer open does that)")

    # -- the one way values are written
    def _put(self, db: bytes, key: bytes, value: bytes) -> None:
        self.txn.put(key, seal(db, key, value), db=self.dbs[db])

    def _delete(self, db: bytes, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[db])

    def set_format(self, version: int) -> None:
        self._put(fmt.DB_META, fmt.META_FORMAT, fmt.U64.pack(version))

    def set_applied(self, position: tuple[int, int] | None) -> None:
        """Records that the log holding `position` (its segment number names the log) is
        applied up to there (format <= 2: META_APPLIED, the one log). None records nothing:
        the cache index of an S3 store applies checkpoints pulled from the bucket, whose
        logs it does not follow."""
        if position is None:
            return
        if self.version < 3:
            self._put(fmt.DB_META, fmt.META_APPLIED, fmt.LOG_POSITION.pack(*position))
            return
        self._put(fmt.DB_LOGS, fmt.LOG_KEY.pack(position[0] // fmt.LOG_SEGMENTS),
                  fmt.LOG_POSITION.pack(*position))

    def set_log_applied(self, log: int, position: tuple[int, int]) -> None:
        """Records that log `log` is applied up to `position` (a position of another log's
        segment would be an error: set_applied derives the log from the position)."""
        if position[0] // fmt.LOG_SEGMENTS != log and position != (0, 0):
            raise ValueError(f"position {position} is not in log {log}")
        self._put(fmt.DB_LOGS, fmt.LOG_KEY.pack(log), fmt.LOG_POSITION.pack(*position))

    def drop_legacy_applied(self) -> None:
        """Removes META_APPLIED (the format 3 upgrade moved it to DB_LOGS)."""
        if self.txn.get(fmt.META_APPLIED, db=self.dbs[fmt.DB_META]) is not None:
            self._delete(fmt.DB_META, fmt.META_APPLIED)

    def take_order(self) -> int:
        """Allocates the next record order."""
        order = self.next_order()
        self._put(fmt.DB_META, fmt.META_NEXT_ORDER, fmt.U64.pack(order + 1))
        return order

    def set_next_order(self, order: int) -> None:
        self._put(fmt.DB_META, fmt.META_NEXT_ORDER, fmt.U64.pack(order))

    def bump_gc_generation(self) -> None:
        self._put(fmt.DB_META, fmt.META_GC_GENERATION, fmt.U64.pack(self.gc_generation() + 1))

    def put_claim(self, order: int, claim: dict, pins: bytes = b"") -> None:
        self._put(fmt.DB_CLAIMS, fmt.CLAIM_KEY.pack(order), join_blob(claim, pins))

    def delete_claim(self, order: int) -> None:
        key = fmt.CLAIM_KEY.pack(order)
        if self.txn.get(key, db=self.dbs[fmt.DB_CLAIMS]) is not None:
            self._delete(fmt.DB_CLAIMS, key)

    def put_group_entry(self, key: bytes, d: dict, blob: bytes = b"") -> None:
        self._put(fmt.DB_GROUPS, key, join_blob(d, blob))

    def delete_group_entries(self, prefix: bytes) -> int:
        """Removes every groups entry under prefix; returns how many."""
        keys = [k for k, _ in self._items(fmt.DB_GROUPS, prefix)]
        for k in keys:
            self._delete(fmt.DB_GROUPS, k)
        return len(keys)

    def set_log_state(self, begin: tuple[int, int], end: tuple[int, int]) -> None:
        self._put(fmt.DB_META, fmt.META_LOG_STATE, fmt.STATE_MARK.pack(*begin, *end))

    def set_next_id(self, next_id: int) -> None:
        self._put(fmt.DB_META, fmt.META_NEXT_ID, fmt.U64.pack(next_id))

    def put_chunk(self, chunk_id: bytes, entry: ChunkEntry) -> None:
        self._put(fmt.DB_CHUNKS, chunk_id, entry.pack())

    def _put_new_chunks(self, new: dict, refs: dict, bases: dict | None = None) -> None:
        """Writes the entries of new chunks {chunk id: (segment, offset, stored, raw, codec)},
        each once, with its count taken out of refs (what put_chunk does, in one LMDB call:
        sealed values sorted by key). bases: {delta chunk id: its base chunk id}; a new delta
        chunk's entry names its base, and adds one to the base's count in refs (its edge)."""
        if not new:
            return
        bases = bases or {}
        for cid, row in new.items():
            if row[4] == fmt.CODEC_DELTA_PLANES:
                base = bases.get(cid)
                if base is None:
                    raise CorruptionError(f"new delta chunk {cid.hex()[:16]}… has no base in "
                                          "its commit record")
                refs[base] = refs.get(base, 0) + 1
        pack, db = fmt.CHUNK_ENTRY.pack, fmt.DB_CHUNKS
        items = []
        for cid in sorted(new):
            seg, off, stored, raw, codec = new[cid]
            value = pack(seg, off, stored, raw, refs.pop(cid, 0), codec)
            if codec == fmt.CODEC_DELTA_PLANES:
                value += bases[cid]
            items.append((cid, seal(db, cid, value)))
        with self.txn.cursor(db=self.dbs[fmt.DB_CHUNKS]) as cur:
            cur.putmulti(items)

    def delete_chunk(self, chunk_id: bytes) -> None:
        """Removes a chunk entry (callers bump the GC generation once per transaction)."""
        self._delete(fmt.DB_CHUNKS, chunk_id)

    def _add_refs(self, blob: bytes, delta: int) -> None:
        self._apply_ref_counts(_count_refs(blob, delta, {}))

    def add_ref_counts(self, counts: dict) -> None:
        """Adds counts[chunk id] to each chunk's reference count (compaction: the edges of
        the delta chunks it removes)."""
        self._apply_ref_counts(counts)

    def _apply_ref_counts(self, counts: dict) -> None:
        """Adds counts[chunk id] to each chunk's reference count."""
        if self.rebuilding:
            return
        for cid, d in counts.items():
            entry = self.chunk(cid)
            if entry is None:
                raise CorruptionError(f"a manifest references chunk {cid.hex()[:16]}… which the "
                                      "index does not have")
            refs = entry.refs + d
            if refs < 0:
                raise CorruptionError(f"reference count of chunk {cid.hex()[:16]}… fell below 0")
            self.put_chunk(cid, entry._replace(refs=refs))

    def _put_info(self, commit: Commit) -> None:
        self._put(fmt.DB_CHECKPOINTS, fmt.CKPT_KEY.pack(commit.id),
                  json.dumps(commit.info_json(), separators=(",", ":")).encode())

    def put_stream(self, stream: str, head: int, seq: int) -> None:
        """Sets a stream's head and last seq (a rebuild from a state section, a pull), once
        its checkpoints are in: it counts them."""
        self._put_stream(stream, head, seq, len(self.checkpoint_ids(stream)))

    def _put_stream(self, stream: str, head: int, seq: int, count: int) -> None:
        self._put(fmt.DB_STREAMS, stream.encode(),
                  json.dumps({"head": head, "seq": seq, "n": count}).encode())

    def put_checkpoint_info(self, commit: Commit) -> None:
        """Rewrites a checkpoint's JSON record (manifests untouched)."""
        self._put_info(commit)

    def set_parent(self, checkpoint_id: int, parent: int | None) -> None:
        """Makes `parent` the checkpoint's parent (its record and the children table); its
        manifests are untouched, so only for a checkpoint whose buffers are all full."""
        commit = self.checkpoint(checkpoint_id)
        if commit is None or commit.parent == parent:
            return
        key = fmt.CKPT_KEY.pack(checkpoint_id)
        if commit.parent is not None:
            self._delete(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(commit.parent) + key)
        commit.parent = parent
        self._put_info(commit)
        if parent is not None:
            self._put(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(parent) + key, b"")

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
            self.apply_delete(records.decode_delete(payload)[0], position)
        elif rtype == fmt.REC_TAG:
            self.apply_tag(*records.decode_tag(payload)[:3], position)

    def apply_commit(self, commit: Commit, position: tuple[int, int],
                     reused: bytes = b"") -> None:
        """Makes a committed checkpoint visible; `position` is just past its commit record.
        reused: a table of more chunk entries (fmt.NEW_CHUNK), of chunks the checkpoint uses
        that the index may lack (an S3 pull: the checkpoint object's reused-chunk table);
        like the commit's new chunks, each absent one is written once, with its count."""
        # the entries of the chunks the index lacks (a rebuild scans the records instead):
        # chunk id -> (segment, offset, stored, raw, codec). Per-chunk work written out: a
        # checkpoint of a GiB brings 16,384 of them. An entry present is left as it is, and
        # checked where its count changes (_apply_ref_counts).
        new: dict[bytes, tuple] = {}
        if not self.rebuilding:
            get, chunks_db = self.txn.get, self.dbs[fmt.DB_CHUNKS]
            for table in (commit.new_chunks, reused):
                for row in fmt.NEW_CHUNK.iter_unpack(table):
                    if row[0] not in new and get(row[0], db=chunks_db) is None:
                        new[row[0]] = row[1:]
        parent = self.checkpoint(commit.parent) if commit.parent is not None else None
        parent_depths = {b.name: b.depth for b in parent.buffers} if parent else {}
        refs: dict[bytes, int] = {}
        for i, b in enumerate(commit.buffers):
            if b.base == "delta" and b.name in parent_depths:
                # depth is derived (invariant 5): with many writers, a delete of an ancestor
                # may have shortened the parent's chain since the commit was planned
                b.depth = parent_depths[b.name] + 1
            _count_refs(b.extents, +1, refs)
            self._put(fmt.DB_MANIFESTS, fmt.MANIFEST_KEY.pack(commit.id, i), b.extents)
        self._put_new_chunks(new, refs, commit.delta_base_ids())
        self._apply_ref_counts(refs)
        self._put_info(commit)
        key = fmt.CKPT_KEY.pack(commit.id)
        listed = _stream_key(commit.stream, key)
        record = self._stream(commit.stream)
        # counted before its key goes in (a count by scan would see it); a re-applied
        # checkpoint is not counted twice
        count = self._stream_count(commit.stream, record)
        if self.txn.get(listed, db=self.dbs[fmt.DB_STREAM_CKPTS]) is None:
            count += 1
        self._put(fmt.DB_STREAM_CKPTS, listed, b"")
        if commit.parent is not None:
            self._put(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(commit.parent) + key, b"")
        self._put_stream(commit.stream, commit.id, max(commit.seq, _record_seq(record)), count)
        self.set_next_id(max(self.next_id(), commit.id + 1))
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
        record = self._stream(victim.stream)
        head_stays = record is not None and record["head"] != victim.id
        # counted before its key goes (a count by scan still sees the victim)
        count = self._stream_count(victim.stream, record) if head_stays else 0
        self._delete(fmt.DB_STREAM_CKPTS, _stream_key(victim.stream, vkey))
        if victim.parent is not None:
            self._delete(fmt.DB_CHILDREN, fmt.CKPT_KEY.pack(victim.parent) + vkey)
        if record is None:
            return
        if not head_stays:
            remaining = self.checkpoint_ids(victim.stream)
            if remaining:
                self._put_stream(victim.stream, remaining[-1], _record_seq(record),
                                 len(remaining))
            else:
                self._delete(fmt.DB_STREAMS, victim.stream.encode())
                self._drop_fingerprints(victim.stream)
        else:
            # the head stays: the count alone tells a cache of the stream it lost one
            self._put_stream(victim.stream, record["head"], _record_seq(record),
                             max(count - 1, 0))
