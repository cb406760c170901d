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

FORMAT_KEY = "snapstore.json"
LOGS_DIR = "logs/"
SEGMENTS_DIR = "segments/"
CHECKPOINTS_DIR = "checkpoints/"
REFS_DIR = "refs/"
GROUPS_DIR = "groups/"
GC_PENDING_KEY = "gc/pending.json"

LOG_DIGITS = 10
CHECKPOINT_DIGITS = 20

# A checkpoint object: magic, version u32, reserved u32, commit payload length u64; then the
# commit payload, the reused-chunk table (format.NEW_CHUNK entries) and an XXH3-64 trailer.
CKPT_MAGIC = b"SNAPCKPT"
CKPT_VERSION = 1
CKPT_HEADER = struct.Struct("<8sIIQ")
CKPT_TRAILER = struct.Struct("<Q")

DURABILITY_MODES = ("remote", "local")   # an S3 store's; "remote" is the default
DEFAULT_REMOTE_SEGMENT_SIZE = 64 << 20   # a pack: one multipart upload of a few parts
DEFAULT_REFRESH_SECONDS = 1.0
DEFAULT_REMOTE_TIMEOUT = 120.0
DEFAULT_GC_GRACE_SECONDS = 3600.0       # also what writers assume while no gc mark exists
MIN_GC_GRACE_SECONDS = 1.0               # writers get grace / 2 for a commit: never nothing
MODIFIED_RESOLUTION = 1.0                # S3's LastModified is truncated to whole seconds
GC_GROUP_GRACES = 2                      # groups/ objects older than this many graces: garbage
GC_COMMIT_ATTEMPTS = 3                   # plans of one commit when gc marks what it reused
CACHE_BLOCK = 1 << 20                    # remote segments are read and cached in blocks


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


def default_cache_root() -> str:
    """$XDG_CACHE_HOME/snapstore, or ~/.cache/snapstore."""
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


def checkpoint_key(checkpoint_id: int) -> str:
    return f"{CHECKPOINTS_DIR}{checkpoint_id:0{CHECKPOINT_DIGITS}d}"


def checkpoint_id_of(key: str) -> int | None:
    """The id a checkpoint object's key (relative to the prefix) names, or None."""
    name = key[len(CHECKPOINTS_DIR):] if key.startswith(CHECKPOINTS_DIR) else ""
    return int(name) if len(name) == CHECKPOINT_DIGITS and name.isdigit() else None


def ref_key(stream: str) -> str:
    return REFS_DIR + stream.encode().hex()


def stream_of_ref(key: str) -> str | None:
    """The stream a ref key (relative to the prefix) names, or None when it is not one."""
    if not key.startswith(REFS_DIR):
        return None
    try:
        return bytes.fromhex(key[len(REFS_DIR):]).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def segment_of(key: str) -> int | None:
    """The segment number a segment object's key names, or None."""
    name = key[len(SEGMENTS_DIR):] if key.startswith(SEGMENTS_DIR) else ""
    stem = name[:-len(fmt.SEGMENT_SUFFIX)] if name.endswith(fmt.SEGMENT_SUFFIX) else ""
    return int(stem) if len(stem) == 16 and stem.isdigit() else None
