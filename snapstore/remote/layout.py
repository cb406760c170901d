"""The remote format: S3 URLs, object keys and the constants of a store in a bucket (the one
source of truth for them; docs/design.md, "S3 stores", explains them)."""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from snapstore.engine import format as fmt
from snapstore.engine.backends.base import segment_name
from snapstore.errors import InvalidArgumentError

SCHEME = "s3://"
REMOTE_FORMAT = "snapstore-s3"
REMOTE_FORMAT_VERSION = 1
# The header version of the segments an S3 store writes: 4, not the local stores' 6. An S3
# store never writes delta chunks (codec 3, what version 5 adds) nor byte planes rotated by
# more than one bit (what version 6 adds), so its records fit version 4, which snapstores of
# format 4 read: they share a bucket during a rolling upgrade.
SEGMENT_VERSION = 4
# The format a new cache index of an S3 store is stamped with (its META_FORMAT): the oldest
# whose library reads everything the cache holds. Format 6 changed nothing an S3 cache holds,
# so snapstores of format 5 and 6 share a cache directory on one machine (a newer stamp would
# make the older library refuse the cache with FormatError). A format that changes what a
# cache holds raises it.
CACHE_INDEX_VERSION = 5
assert SEGMENT_VERSION in fmt.SEGMENT_CODECS and \
    fmt.CODEC_DELTA_PLANES not in fmt.SEGMENT_CODECS[SEGMENT_VERSION] and \
    fmt.WRITTEN_PLANE_ROTATIONS[SEGMENT_VERSION] == (fmt.PLANES_ROTATE,)
assert CACHE_INDEX_VERSION <= fmt.FORMAT_VERSION

FORMAT_KEY = "snapstore.json"
LOGS_DIR = "logs/"
SEGMENTS_DIR = "segments/"
CHECKPOINTS_DIR = "checkpoints/"
REFS_DIR = "refs/"
GROUPS_DIR = "groups/"
INTENTS_DIR = "intents/"
GC_PENDING_KEY = "gc/pending.json"

LOG_DIGITS = 10
CHECKPOINT_DIGITS = 20

# A checkpoint object: magic, version u32, reserved u32, commit payload length u64; then the
# commit payload, the reused-chunk table (format.NEW_CHUNK entries) and an XXH3-64 trailer.
CKPT_MAGIC = b"SNAPCKPT"
CKPT_VERSION = 1
# Checkpoint objects and group parts share one framing (remote/envelope.py): magic,
# version u32, reserved u32, a length u64; the body; XXH3-64 of everything before it.
OBJECT_HEADER = struct.Struct("<8sIIQ")
OBJECT_TRAILER = struct.Struct("<Q")

# A group's objects, under GROUPS_DIR<group id>/: its header (JSON), its staged parts (one
# object per participant, named by the hex of the participant's UTF-8 name), and its outcome
# (JSON, created If-None-Match: *: "commit" or "aborted", whichever comes first).
GROUP_ID_HEX = 32                        # a group id: uuid4().hex
GROUP_HEADER = "header"
GROUP_PARTS = "parts/"
GROUP_OUTCOME = "outcome"

# A group's part object: magic, version u32, reserved u32, JSON length u64; then the JSON
# (group, participant, stream, parent, meta, buffers, table sizes, bytes_new), the blob (the
# new-chunk table, the reused-chunk table, each buffer's extents) and an XXH3-64 trailer.
PART_MAGIC = b"SNAPPART"
PART_VERSION = 1

# Upload intents (remote/intents.py), under INTENTS_DIR: INTENTS_DIR<ms>-<writer>-<n>, the
# intent (created If-None-Match: *), and the same key + INTENT_OUTCOME_SUFFIX, its outcome.
# Both in the checked framing: the intent's body is INTENT_HEADER (the plan's bytes u64, the
# count u32) and that many XXH3-64 u64 of the chunks; the outcome's is a format.NEW_CHUNK
# table (empty: the writer gave up). They are optional: a reader that ignores them (an older
# snapstore) only stores again what another writer is uploading at the same moment, so the
# remote format's version is unchanged.
INTENT_MAGIC = b"SNAPINTN"
INTENT_OUTCOME_MAGIC = b"SNAPINTO"
INTENT_VERSION = 1
INTENT_HEADER = struct.Struct("<QI")
INTENT_FINGERPRINT = struct.Struct("<Q")
INTENT_OUTCOME_SUFFIX = ".done"
INTENT_TIME_DIGITS = 15                  # milliseconds since the epoch, zero-padded: key order
INTENT_MIN_BYTES = 8 << 20               # plans storing less go without an intent
INTENT_LOOKBACK_SECONDS = 600.0          # intents older than this are not read
INTENT_WAIT_SECONDS = 15.0               # how long a writer waits for another's outcome: this,
INTENT_WAIT_RATE = 8 << 20               # plus that writer's plan bytes (at most 4x the bytes
                                         # they share) at this many per second
INTENT_POLL_SECONDS = 0.05               # between reads of an outcome not there yet
INTENT_SETTLE_MIN_SECONDS = 0.02         # between creating an intent and listing the others:
INTENT_SETTLE_MAX_SECONDS = 1.0          # twice the creating PUT's time, within these
GC_INTENT_SECONDS = 3600.0               # gc deletes intents older than this (or 2 graces)

DURABILITY_MODES = ("remote", "local")   # an S3 store's; "remote" is the default
DEFAULT_REMOTE_SEGMENT_SIZE = 64 << 20   # a pack: one multipart upload of a few parts
DEFAULT_REFRESH_SECONDS = 1.0
DEFAULT_REMOTE_TIMEOUT = 120.0
DEFAULT_GC_GRACE_SECONDS = 3600.0       # also what writers assume while no gc mark exists
MIN_GC_GRACE_SECONDS = 1.0               # writers get grace / 2 for a commit: never nothing
MODIFIED_RESOLUTION = 1.0                # S3's LastModified is truncated to whole seconds
GC_GROUP_GRACES = 2                      # groups/ objects older than this many graces: garbage
GC_COMMIT_ATTEMPTS = 3                   # plans of one commit when gc marks what it reused
# Remote segments are read and cached in aligned blocks of CACHE_BLOCK bytes, one file each,
# under CACHE_RANGES_DIR, named SEGMENT+OFFSET. 4 MiB: on ext4 here a file costs about 1 ms
# of kernel time to create, so 1 MiB blocks cost more than the bytes they hold.
CACHE_BLOCK = 4 << 20
CACHE_RANGES_DIR = "ranges"
CACHE_LOCK_FILE = "lock"         # flock()ed shared by every open Store, exclusively by a rebuild


def is_remote(path) -> bool:
    """Whether a store path names an S3 store (s3://...)."""
    return isinstance(path, str) and path.startswith(SCHEME)


@dataclass(frozen=True)
class RemoteURL:
    bucket: str
    prefix: str           # "" or ends with "/"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"

    def key(self, name: str) -> str:
        return self.prefix + name


def parse_url(url: str) -> RemoteURL:
    """s3://BUCKET[/PREFIX] -> RemoteURL; raises InvalidArgumentError for anything else."""
    if not is_remote(url):
        raise InvalidArgumentError(f"not an S3 URL (s3://BUCKET/PREFIX): {url!r}")
    rest = url[len(SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not 3 <= len(bucket) <= 63 or any(c not in "abcdefghijklmnopqrstuvwxyz0123456789.-"
                                         for c in bucket):
        raise InvalidArgumentError(f"{url!r}: the bucket name must be 3-63 characters of "
                                   "a-z, 0-9, '.' and '-'")
    prefix = prefix.strip("/")
    if "//" in prefix or any(part in (".", "..") for part in prefix.split("/") if prefix):
        raise InvalidArgumentError(f"{url!r}: the prefix must not hold empty, '.' or '..' "
                                   "parts")
    return RemoteURL(bucket, prefix + "/" if prefix else "")


CACHE_ENV = "SNAPSTORE_CACHE_DIR"
CACHE_LIMIT_ENV = "SNAPSTORE_CACHE_BYTES"
DEFAULT_CACHE_LIMIT = 16 << 30          # cached segment bytes per store, then oldest go


def cache_limit() -> int:
    """The most segment bytes one store's cache keeps: $SNAPSTORE_CACHE_BYTES, else 16 GiB."""
    value = os.environ.get(CACHE_LIMIT_ENV)
    try:
        return max(0, int(value)) if value else DEFAULT_CACHE_LIMIT
    except ValueError:
        raise InvalidArgumentError(f"${CACHE_LIMIT_ENV} must be a number of bytes, got "
                                   f"{value!r}") from None


FETCH_THREADS_ENV = "SNAPSTORE_S3_FETCH_THREADS"
FETCH_THREADS_PER_CPU = 2               # the default: 2 ranged GETs in flight per core,
MIN_FETCH_THREADS, MAX_FETCH_THREADS = 4, 16    # within these bounds


def fetch_threads() -> int:
    """How many ranged GETs a read keeps in flight: $SNAPSTORE_S3_FETCH_THREADS, else 2 per
    usable core within 4..16. Each fetch costs this machine CPU (receiving, checking, writing
    the cache), and a server on the same machine more: on 2 cores with a loopback SeaweedFS,
    a 1 GiB restore ran at 0.74x a raw ranged get with 4 in flight, 0.42x with 8 and 0.38x
    with 16 (README, the S3 figures). A far server with more latency wants more: set the
    variable."""
    value = os.environ.get(FETCH_THREADS_ENV)
    if value:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise InvalidArgumentError(f"${FETCH_THREADS_ENV} must be a whole number of "
                                       f"threads, 1 or more, got {value!r}")
        return threads
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(MIN_FETCH_THREADS, min(MAX_FETCH_THREADS, FETCH_THREADS_PER_CPU * cpus))


def default_cache_root() -> str:
    """$SNAPSTORE_CACHE_DIR, else $XDG_CACHE_HOME/snapstore, else ~/.cache/snapstore."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "snapstore")


def cache_dir_for(root: str, endpoint: str, url: RemoteURL) -> str:
    """The cache directory of one store: one per endpoint, bucket and prefix under root."""
    tag = hashlib.sha256(f"{endpoint}\0{url.bucket}\0{url.prefix}".encode()).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-." else "_"
                       for c in f"{url.bucket}-{url.prefix}".strip("-/"))[:48]
    return os.path.join(root, f"{readable}-{tag}")


def log_key(log: int) -> str:
    return f"{LOGS_DIR}{log:0{LOG_DIGITS}d}"


def segment_key(number: int) -> str:
    return SEGMENTS_DIR + segment_name(number)


def log_segments_prefix(log: int) -> str:
    """The beginning every segment key of log `log` shares (and no other log's does)."""
    digits = len(str(fmt.LOG_SEGMENTS)) - 1         # the segment number within its log
    return segment_key(log * fmt.LOG_SEGMENTS)[:len(SEGMENTS_DIR) + 16 - digits]


def checkpoint_key(checkpoint_id: int) -> str:
    return f"{CHECKPOINTS_DIR}{checkpoint_id:0{CHECKPOINT_DIGITS}d}"


def checkpoint_id_of(key: str) -> int | None:
    """The id a checkpoint object's key (relative to the prefix) names, or None."""
    name = key[len(CHECKPOINTS_DIR):] if key.startswith(CHECKPOINTS_DIR) else ""
    return int(name) if len(name) == CHECKPOINT_DIGITS and name.isdigit() else None


# Names go into keys as their hex (any bytes, no "/"): two characters a byte. Object stores
# limit a key's path component (SeaweedFS: 255 bytes, "KeyTooLongError"; AWS: the whole key
# to 1024), so an S3 store takes streams and group participants of at most this many UTF-8
# bytes for new refs and parts (check_key_name); reads take any name the store has.
MAX_KEY_NAME_BYTES = 127


def check_key_name(name: str, what: str) -> None:
    """InvalidArgumentError when `name` is too long to name a new ref or part object."""
    if len(name.encode()) > MAX_KEY_NAME_BYTES:
        raise InvalidArgumentError(
            f"{what} {name[:40]!r}... is {len(name.encode())} UTF-8 bytes: an S3 store takes "
            f"at most {MAX_KEY_NAME_BYTES} (its key holds the name's hex, and object stores "
            "such as SeaweedFS take at most 255 bytes for a key's last part)")


def ref_key(stream: str) -> str:
    return REFS_DIR + stream.encode().hex()


def stream_of_ref(key: str) -> str | None:
    """The stream a ref key (relative to the prefix) names, or None when it is not one."""
    if not key.startswith(REFS_DIR) or key == REFS_DIR:     # (a "folder" marker: no stream)
        return None
    try:
        return bytes.fromhex(key[len(REFS_DIR):]).decode() or None
    except (ValueError, UnicodeDecodeError):
        return None


def segment_of(key: str) -> int | None:
    """The segment number a segment object's key names, or None."""
    name = key[len(SEGMENTS_DIR):] if key.startswith(SEGMENTS_DIR) else ""
    stem = name[:-len(fmt.SEGMENT_SUFFIX)] if name.endswith(fmt.SEGMENT_SUFFIX) else ""
    return int(stem) if len(stem) == 16 and stem.isdigit() else None


def is_group_id(group) -> bool:
    """Whether `group` is shaped like a group id (so that it is a safe part of a key)."""
    return isinstance(group, str) and len(group) == GROUP_ID_HEX and \
        all(c in "0123456789abcdef" for c in group)


def group_key(group: str, name: str) -> str:
    return f"{GROUPS_DIR}{group}/{name}"


def group_header_key(group: str) -> str:
    return group_key(group, GROUP_HEADER)


def group_outcome_key(group: str) -> str:
    return group_key(group, GROUP_OUTCOME)


def group_part_key(group: str, participant: str) -> str:
    return group_key(group, GROUP_PARTS + participant.encode().hex())


def intent_key(millis: int, writer: str, serial: int) -> str:
    return f"{INTENTS_DIR}{millis:0{INTENT_TIME_DIGITS}d}-{writer}-{serial}"


def intent_millis(key: str) -> int | None:
    """The time (ms) an intent's or its outcome's key (relative to the prefix) names, or None
    when it is not one."""
    name = key[len(INTENTS_DIR):] if key.startswith(INTENTS_DIR) else ""
    stem = name[:INTENT_TIME_DIGITS]
    if len(stem) != INTENT_TIME_DIGITS or not stem.isdigit() or \
            name[INTENT_TIME_DIGITS:INTENT_TIME_DIGITS + 1] != "-":
        return None
    return int(stem)
