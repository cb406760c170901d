"""On-disk format constants and byte layouts: the one source of truth (docs/design.md explains them).

Everything little-endian unless a key must sort numerically (LMDB keys are big-endian).
"""
from __future__ import annotations

import struct

# ---- store directory --------------------------------------------------------------------
FORMAT_FILE = "FORMAT"          # JSON: {"format": FORMAT_NAME, "version": FORMAT_VERSION, ...}
FORMAT_NAME = "snapstore"
FORMAT_VERSION = 6              # bump on any incompatible change; newer -> FormatError
MIN_FORMAT_VERSION = 1          # the oldest version this library reads (and upgrades: upgrade.py)
# Format history:
#   1  the first on-disk format (tests/golden/stores/v1)
#   2  every LMDB index value carries a checksum (INDEX_VALUE_CHECKSUM below); the log is
#      complete: state sections (REC_STATE_*) in segments of header version 2 describe what
#      compaction removed, so the index can be rebuilt from the segments alone (repair.py)
#   3  many writers: each writer process appends to a log of its own (segment numbers
#      log * LOG_SEGMENTS + n, STORE/writers/ lock files); index records carry a store-wide
#      order number (commit JSON "order", DELETE_ORDER, tag JSON "order", state sections name
#      the order and the position each log is covered up to); the index keeps an applied
#      position per log (DB_LOGS) and the operations in progress (DB_CLAIMS, DB_GROUPS)
#   4  chunk records may use CODEC_PLANES (byte planes of fixed-size items, engine/planes.py),
#      in segments of header version 4 (SEGMENT_CODECS); no other layout changed (the upgrade
#      from 3 sets the index's META_FORMAT to 4; each log goes on in a new segment of version
#      4 at its writer's next open, as with every new header version)
#   5  chunk records may use CODEC_DELTA_PLANES (a chunk coded against the chunk at the same
#      place in the parent checkpoint, its base, named by id in the record), in segments of
#      header version 5; a chunk that is the base of a live chunk stays (compaction's mark
#      follows bases); no other layout changed (the upgrade from 4 sets the index's
#      META_FORMAT to 5)
#   6  a CODEC_PLANES record's PLANES_HEADER flags are a rotation of 0..7 bits (format 4 and
#      5: 0 or 1), in segments of header version 6 (SEGMENT_PLANE_ROTATIONS); writers at
#      compression_level 3 or more rotate a float buffer's items by 3 where their probe finds
#      that smaller (float32, bfloat16, float64 weights; docs/floatcodec.md, "The rotation");
#      no other layout changed (the upgrade from 5 sets the index's META_FORMAT to 6)
INDEX_DIR = "index"             # the LMDB environment (data.mdb, lock.mdb)
INDEX_DATA_FILE = "data.mdb"    # LMDB's data file inside INDEX_DIR
INDEX_LOCK_TABLE_FILE = "lock.mdb"   # LMDB's reader table inside INDEX_DIR (not a store lock)
INDEX_LOCK_TABLE_BYTES = 16 << 10    # blocks reserved for a new one (LMDB's own size: ~8 KiB)
INDEX_REBUILD_DIR = ".index.new"  # repair builds, compaction copies, a new index here, then
                                  # swaps it in (indexswap.py)
INDEX_OLD_DIR = ".index.old"      # the replaced index, removed once the swap is durable
SEGMENTS_DIR = "segments"       # the write-ahead log: NNNNNNNNNNNNNNNN.seg files
SEGMENT_SUFFIX = ".seg"
LOCK_FILE = "lock"              # flock()ed shared by every writer, exclusively by what needs the
                                # store to itself (creation, upgrade, repair; format <= 2 writers)
WRITERS_DIR = "writers"         # one lock file per log, named by its number: flocked exclusively
                                # by the writer appending to that log (its holder's record inside)
LOG_CHOICE_LOCK_FILE = ".choosing"  # in WRITERS_DIR: flocked exclusively by an opening writer
                                # while it recovers the free logs and adopts one (logowners.py)
UNSYNCED_DIR = "unsynced"       # marks of writers whose index runs without syncs, one file
                                # each named <boot id>.<token>, flocked by it (unsynced.py)
MAINTENANCE_LOCK_FILE = "maintenance"   # flock()ed exclusively by compaction, shared by verify
INDEX_GATE_FILE = "index.gate"  # beside INDEX_DIR: flock()ed exclusively by every index write
                                # transaction, from before it waits for LMDB's write lock until
                                # it ended (writegate.py); empty
LOG_SEGMENTS = 10 ** 9          # log L's segments are numbered L * LOG_SEGMENTS + n, 1 <= n <
                                # LOG_SEGMENTS: file names show the log (0000003000000005.seg
                                # is log 3's 5th); format <= 2 stores hold log 0 only
MAX_LOGS = 10 ** 7              # 16 decimal digits of segment number

# ---- checkpoint meta --------------------------------------------------------------------
# Top-level keys of a checkpoint's meta dict that start with this prefix belong to snapstore's
# own layers ("snapstore.objects", "snapstore.dcp", "snapstore.workflow", ...): never the
# user's, hidden from CheckpointInfo.meta and `ls` (snapstore.engine.meta splits them).
RESERVED_META_PREFIX = "snapstore."
# The reserved key of a DCP checkpoint (snapstore.torch.SnapstoreWriter): {"checkpoint_id": the
# id given to dcp.save, "version", "parts", "ranks"}. Here, not in torch.py, so the engine's name
# resolver (engine/names.py) finds checkpoints by DCP checkpoint_id without importing torch.
DCP_META_KEY = "snapstore.dcp"
DCP_PART_KEY = "snapstore.dcp_part"    # ... of one rank's part of a DCP checkpoint (format <= 2
                                       # saves: parts were checkpoints of their own)
# The reserved key of a group commit's checkpoint (engine/groups.py): {"id": the group id,
# "parts": {participant: the meta it staged its part with}} (+ "user": the coordinator's meta
# when that was not a dict).
GROUP_META_KEY = "snapstore.group"
# The reserved key of a checkpoint copied from another store or imported from a savepoint file
# (snapstore.copying, snapstore.savepoints): {"store": where the original lay (its path or URL),
# "id": its id there} (+ "file": the savepoint file's name; + "user": the original meta when
# that was not a dict). Provenance only: engine.meta.original_meta() takes it off again.
ORIGIN_META_KEY = "snapstore.copied_from"

# ---- segment files ------------------------------------------------------------------------
# A segment starts with a fixed header, then records back to back until its end.
SEGMENT_MAGIC = b"SNAPSEG\x00"
SEGMENT_HEADER = struct.Struct("<8sIIQQ")   # magic, format version, reserved 0, segment number,
assert SEGMENT_HEADER.size == 32            # XXH3-64 of the preceding 24 bytes
SEGMENT_VERSION = 6             # the header version of the segments this library creates; a
                                # segment only ever holds records of its header's version
SEGMENT_RECORD_TYPES = {1: (1, 2, 3, 4), 2: (1, 2, 3, 4, 5, 6, 7),   # version -> record types
                        3: (1, 2, 3, 4, 5, 6, 7), 4: (1, 2, 3, 4, 5, 6, 7),
                        5: (1, 2, 3, 4, 5, 6, 7), 6: (1, 2, 3, 4, 5, 6, 7)}
ORDERED_SINCE = 3               # segment version from which index records carry their order

# Every record: header, then `length` payload bytes. The checksum is XXH3-64 (seed 0) over the
# first 16 header bytes followed by the payload, so a torn or flipped record never validates.
RECORD_MAGIC = b"SREC"
RECORD_HEADER = struct.Struct("<4sBBHIIQ")  # magic, type, codec, flags 0, length, reserved 0,
assert RECORD_HEADER.size == 24             # checksum
RECORD_CHECKSUMMED_PREFIX = 16              # header bytes covered by the checksum
MAX_RECORD_PAYLOAD = (1 << 32) - 1          # u32 length field

# Record types.
REC_CHUNK = 1      # payload: CHUNK_PREFIX + chunk bytes (compressed per codec)
REC_COMMIT = 2     # payload: a checkpoint commit (see records.py)
REC_DELETE = 3     # payload: DELETE_PAYLOAD (checkpoint id); version 3: DELETE_ORDERED
REC_TAG = 4        # payload: UTF-8 JSON {"id": checkpoint id, "tag": str, "add": bool}; version 3
                   # adds "order": int and "records": how many records carry that order
# A state section (segment version 2): the whole checkpoint state at one moment, so that the
# records before it are no longer needed (compaction writes one before removing segments).
REC_STATE_BEGIN = 5       # payload: UTF-8 JSON {"next_id": int, "checkpoints": count,
                          #   "streams": {name: {"head": id, "seq": last seq}}}; version 3
                          #   adds "order": int (the section's), "next_order": int and
                          #   "logs": {"L": [segment, offset]}: log L's records before that
                          #   position are covered by the section
REC_STATE_CHECKPOINT = 6  # payload: a commit payload (records.py) without new-chunk table:
                          #   one live checkpoint, its current manifests, tags, depths
REC_STATE_END = 7         # payload: STATE_END
RECORD_TYPES = (REC_CHUNK, REC_COMMIT, REC_DELETE, REC_TAG, REC_STATE_BEGIN,
                REC_STATE_CHECKPOINT, REC_STATE_END)
INDEX_RECORD_TYPES = (REC_COMMIT, REC_DELETE, REC_TAG)      # applied by apply_record
STATE_RECORD_TYPES = (REC_STATE_BEGIN, REC_STATE_CHECKPOINT, REC_STATE_END)

# Chunk codecs (the record header's codec byte; 0 for non-chunk records).
CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_PLANES = 2          # byte planes of fixed-size items, each raw or zstd (engine/planes.py);
                          # only in segments of header version 4 or later
CODEC_DELTA_PLANES = 3    # the delta of a chunk against its base chunk, as byte planes (below);
                          # only in segments of header version 5 or later
CODECS = (CODEC_RAW, CODEC_ZSTD, CODEC_PLANES, CODEC_DELTA_PLANES)
SEGMENT_CODECS = {1: (0, 1), 2: (0, 1), 3: (0, 1), 4: (0, 1, 2),   # segment version -> codecs
                  5: (0, 1, 2, 3), 6: (0, 1, 2, 3)}

# CODEC_PLANES stored bytes: PLANES_HEADER, itemsize PLANE_ENTRYs, the planes, the tail bytes.
PLANES_HEADER = struct.Struct("<BB")         # item size, flags
PLANE_ENTRY = struct.Struct("<BI")           # how the plane is stored, its stored length
PLANES_ITEMSIZES = (2, 4, 8)
PLANES_ROTATE = 1                            # flags 1: items rotated left one bit before the split
PLANES_ROTATION = 7                          # the flags are the rotation in bits (0..7), format 6
# segment version -> the rotations (PLANES_HEADER flags) its CODEC_PLANES records may hold
SEGMENT_PLANE_ROTATIONS = {4: (0, 1), 5: (0, 1), 6: tuple(range(PLANES_ROTATION + 1))}
# segment version -> the rotations a writer may choose among for a buffer's byte-plane chunks,
# the first its default (planes.probe: the one whose samples code smallest; 3 for float32 and
# bfloat16 weights, 1 for float16; writer.plane_rotations: from compression_level 3 only)
WRITTEN_PLANE_ROTATIONS = {4: (1,), 5: (1,), 6: (1, 3)}
PLANE_RAW = 0
PLANE_ZSTD = 1

# CODEC_DELTA_PLANES stored bytes (docs/floatcodec.md, "Decided (stop 37)"; coded and decoded
# by the C core: snap_write_chunks, snap_read_chunks): DELTA_HEADER (the base chunk's id, the
# chunk's depth: 1 when its base is stored whole, else 1 + the base's), then a plane section
# laid out as CODEC_PLANES' with flags 0, whose planes are those of zigzag(item - base item)
# over little-endian words (native.DELTA_SUB), the tail bytes XOR the base's. The chunk id
# stays the BLAKE3 of the decoded bytes; the base is as long as the chunk.
DELTA_HEADER = struct.Struct("<32sB")        # base chunk id, depth (1..MAX_DELTA_DEPTH)
MAX_DELTA_DEPTH = 255                        # the depth byte's range; writers stop far lower

CHUNK_ID_BYTES = 32                          # BLAKE3-256 of the uncompressed chunk
CHUNK_PREFIX = struct.Struct("<32sI")        # chunk id, raw (uncompressed) length
assert CHUNK_PREFIX.size == 36
DELETE_PAYLOAD = struct.Struct("<Q")         # checkpoint id
DELETE_ORDERED = struct.Struct("<QQI")       # checkpoint id, the record's order, how many records
                                             # carry that order (one batch: all or none; version 3)
STATE_END = struct.Struct("<QQ")             # number of STATE_CHECKPOINT records, XXH3-64 of
                                             # the BEGIN payload and every CHECKPOINT payload

# ---- commit record payload -----------------------------------------------------------------
# u32 length of a UTF-8 JSON header (version 3: with "order", the record's order), the JSON
# header, then the new-chunk table, then (format 5, when the header says "delta_bases": n > 0)
# the base of each CODEC_DELTA_PLANES chunk of the new-chunk table
# (json["new_chunks"] entries of NEW_CHUNK), then each buffer's extents (json buffers[i]
# ["extents"] entries of EXTENT) in buffer order.
COMMIT_JSON_LEN = struct.Struct("<I")
NEW_CHUNK = struct.Struct("<32sQQIIB")       # id, segment, record offset, stored payload length
assert NEW_CHUNK.size == 57                  # (prefix + data), raw length, codec
DELTA_BASE = struct.Struct("<32s32s")        # format 5: a delta chunk of the new-chunk table, its
                                             # base chunk (json["delta_bases"] entries, after
                                             # the new-chunk table; the key absent when none)
EXTENT = struct.Struct("<QII32s")            # buffer offset, offset inside chunk, length, chunk id
assert EXTENT.size == 48

# ---- savepoint files ------------------------------------------------------------------------
# One checkpoint in one self-contained, portable file (engine/savefile.py; docs/design.md,
# "Savepoint files"): SAVEPOINT_HEADER, the description (UTF-8 JSON of the checkpoint, then
# each buffer's full manifest as EXTENTs in buffer order), the chunk records the manifests
# name (each chunk once; records exactly as in segments: RECORD_HEADER + chunk payload), then
# SAVEPOINT_TRAILER. All integers little-endian.
SAVEPOINT_SUFFIX = ".snap"
SAVEPOINT_FORMAT = "snapstore-savepoint"    # the description's "format"
SAVEPOINT_MAGIC = b"SNAPSAVE"
SAVEPOINT_VERSION = 1           # the version this library writes and the newest it reads
SAVEPOINT_HEADER = struct.Struct("<8sIIQQQQ")  # magic, version, reserved 0, JSON length,
assert SAVEPOINT_HEADER.size == 48             # manifests length, XXH3-64 of the description
                                               # (JSON + manifests), XXH3-64 of bytes 0..39
SAVEPOINT_TRAILER_MAGIC = b"SNAPEND\x00"
SAVEPOINT_TRAILER = struct.Struct("<8sQQQ")    # magic, number of chunk records, offset of
assert SAVEPOINT_TRAILER.size == 32            # the trailer (= the file's length before it),
                                               # XXH3-64 of every byte before this field

# ---- LMDB index ----------------------------------------------------------------------------
DB_META = b"meta"                 # META_* keys below
DB_CHUNKS = b"chunks"             # chunk id -> CHUNK_ENTRY
DB_CHECKPOINTS = b"checkpoints"   # CKPT_KEY -> JSON checkpoint info
DB_MANIFESTS = b"manifests"       # MANIFEST_KEY -> packed EXTENTs
DB_STREAMS = b"streams"           # stream name (UTF-8) -> JSON {"head": id, "seq": last seq,
                                  # "n": its number of checkpoints}
DB_STREAM_CKPTS = b"stream_ckpts" # stream name + b"\0" + CKPT_KEY -> b""
DB_CHILDREN = b"children"         # CKPT_KEY(parent) + CKPT_KEY(child) -> b""
DB_FINGERPRINTS = b"fingerprints" # stream name + b"\0" + buffer name -> FP_HEADER + digests
DB_LOGS = b"logs"                 # LOG_KEY -> LOG_POSITION just past the log's last applied
                                  # record (format 3; format <= 2: META_APPLIED, log 0)
DB_CLAIMS = b"claims"             # CLAIM_KEY (order) -> an operation in progress: BLOB_HEADER +
                                  # UTF-8 JSON + packed chunk ids it pins (format 3)
DB_GROUPS = b"groups"             # group id (UTF-8) + b"\0" + participant (UTF-8; b"" for the
                                  # group itself) -> BLOB_HEADER + UTF-8 JSON + blobs (format 3)
INDEX_DBS = (DB_META, DB_CHUNKS, DB_CHECKPOINTS, DB_MANIFESTS, DB_STREAMS, DB_STREAM_CKPTS,
             DB_CHILDREN, DB_FINGERPRINTS, DB_LOGS, DB_CLAIMS, DB_GROUPS)
INDEX_DBS_SINCE = {DB_LOGS: 3, DB_CLAIMS: 3, DB_GROUPS: 3}   # databases older indexes lack

META_APPLIED = b"applied"         # LOG_POSITION just past the last record applied to the index
                                  # (format <= 2; format 3 keeps one per log in DB_LOGS)
META_NEXT_ORDER = b"next_order"   # u64: the next record order (format 3)
META_GC_GENERATION = b"gc_generation"  # u64: bumped by every transaction that deletes chunk
                                  # entries, so a commit knows whether the chunks it reused
                                  # may have gone since it planned (format 3)
META_NEXT_ID = b"next_id"         # u64: the next checkpoint id
META_FORMAT = b"format"           # U64: FORMAT_VERSION of the index's layout; from format 2
                                  # on followed by its checksum like every value (a value of
                                  # exactly 8 bytes is a format 1 index, whose values have none)
META_LOG_STATE = b"log_state"     # STATE_MARK: where the newest durable state section lies
                                  # (absent: none written since the index was created)

CKPT_KEY = struct.Struct(">Q")                # big-endian so LMDB sorts ids numerically
MANIFEST_KEY = struct.Struct(">QI")           # checkpoint id, buffer index
CHUNK_ENTRY = struct.Struct("<QQIIQB")        # segment, record offset, stored payload length,
assert CHUNK_ENTRY.size == 33                 # raw length, reference count, codec
# format 5: a CODEC_DELTA_PLANES chunk's entry is CHUNK_ENTRY followed by its base chunk's id
# (CHUNK_ID_BYTES). Its reference count counts the extents that name it and the delta chunks
# whose entries name it as their base (edges): a base outlives every chunk coded against it.
LOG_POSITION = struct.Struct("<QQ")           # segment number, byte offset
STATE_MARK = struct.Struct("<QQQQ")           # LOG_POSITION of a state section's first record,
                                              # LOG_POSITION just past its last
U64 = struct.Struct("<Q")
LOG_KEY = struct.Struct(">I")                 # log number
CLAIM_KEY = struct.Struct(">Q")               # the claimed order number
BLOB_HEADER = struct.Struct("<I")             # length of the JSON that follows
FP_HEADER = struct.Struct("<QII")             # checkpoint id the digests describe, page size,
assert FP_HEADER.size == 16                   # reserved 0

# From format 2 on, every value of every database is its payload (the layouts above; b"" for
# stream_ckpts and children) followed by INDEX_VALUE_CHECKSUM: XXH3-64 (seed 0) of
#   database name + b"\0" + INDEX_KEY_LENGTH(len(key)) + key + payload
# so a flipped bit, or a value stored under another key or database, never validates.
INDEX_VALUE_CHECKSUM = struct.Struct("<Q")
INDEX_KEY_LENGTH = struct.Struct("<I")
INDEX_CHECKSUMS_SINCE = 2                     # format 1 index values carry no checksum

# LMDB map size: address space only (the file grows as needed). 64 GiB of index holds ~40 TiB
# of unique data (an entry per 64 KiB chunk is ~100 bytes), and a process can still open about
# 2,000 stores at once in x86-64's 128 TiB of user address space (1 TiB maps allowed only ~126).
INDEX_MAP_SIZE = 64 << 30
INDEX_MAX_DBS = 16

# ---- names and defaults --------------------------------------------------------------------
MAX_NAME_BYTES = 255              # stream and buffer names: UTF-8, no NUL, 1..255 bytes
DEFAULT_PAGE_SIZE = 4096
DEFAULT_CHUNK_SIZE = 64 << 10     # full checkpoints: fixed grid of this size; deltas: runs split
                                  # into pieces of at most this size
DEFAULT_CDC_SIZES = (16 << 10, 64 << 10, 256 << 10)   # FastCDC min / avg / max
MAX_CHUNK_BYTES = 8 << 20         # the largest chunk a store writes: chunk_size and the CDC max
                                  # are limited to it (a chunk is gathered whole into the write
                                  # path's staging buffer of this size). Readers refuse a chunk
                                  # record claiming more before decompressing anything.
DEFAULT_MAX_CHAIN = 16            # restoring reads at most this many manifests: the delta that
                                  # would make it max_chain is rebased into a full manifest
DEFAULT_FULL_THRESHOLD = 0.5      # ... or when more than this fraction of its pages changed
DEFAULT_SEGMENT_SIZE = 256 << 20  # a segment is sealed once it grows past this
DEFAULT_COMPRESSION_LEVEL = 1     # zstd level; incompressible chunks are stored raw
DEFAULT_COMPACT_THRESHOLD = 0.5   # compact() rewrites sealed segments less live than this
DEFAULT_COMPACT_MAX_GARBAGE = 0.1 # ... and more, emptiest first, until the garbage left is at
                                  # most this fraction of the live bytes (store <= 1.1x live)

DURABILITY_MODES = ("fsync", "none")
CHUNKING_MODES = ("pages", "cdc")
COMPRESSION_MODES = ("zstd", "none")
