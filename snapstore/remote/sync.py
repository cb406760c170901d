"""Pulling an S3 store's state into the local cache index (docs/design.md, "S3 stores").

pull_stream reads a stream's ref, fetches the checkpoint objects of its live checkpoints the
cache lacks (and of the delta ancestors they need), and applies them in id order to the
index, then the deletes and tags the ref implies, then the ref's head and seq. Applying is
idempotent (what is there is skipped), so pulls of several threads or processes sharing a
cache directory may overlap.
"""
from __future__ import annotations

from snapstore.engine.index import Index, IndexWriter
from snapstore.engine.records import Commit
from snapstore.remote import checkpoints as ckpt_objects
from snapstore.remote import layout, refs
from snapstore.remote.s3client import NotFound, S3Client
from snapstore.errors import CorruptionError


def fetch_checkpoint(client: S3Client, checkpoint_id: int) -> tuple[Commit, bytes]:
    """(Commit, reused-chunk table) of a checkpoint object; CorruptionError when missing."""
    key = layout.checkpoint_key(checkpoint_id)
    try:
        data, _ = client.get(key)
    except NotFound:
        raise CorruptionError(f"checkpoint object {client.url.key(key)!r} is missing (a live "
                              "checkpoint or an ancestor its deltas need)") from None
    return ckpt_objects.decode(data, key)


def apply_checkpoint(w: IndexWriter, commit: Commit, reused: bytes) -> bool:
    """Applies a checkpoint to the cache index unless it is there; returns whether it did."""
    if w.checkpoint(commit.id) is not None:
        return False
    w.apply_commit(commit, None, reused)
    return True


def apply_ref(w: IndexWriter, ref: refs.Ref, fetched: dict) -> None:
    """Makes the index's view of ref.stream what the ref says: fetched checkpoints applied in
    id order, checkpoints no longer live deleted, tags and head as the ref has them."""
    for cid in sorted(fetched):
        apply_checkpoint(w, *fetched[cid])
    live = set(ref.live)
    for cid in w.checkpoint_ids(ref.stream):
        if cid not in live:
            w.apply_delete(cid, None)
    for cid in ref.live:
        commit = w.checkpoint(cid)
        if commit is None:
            continue
        want = sorted(ref.tags.get(cid, []))
        if sorted(commit.tags) != want:
            for tag in set(commit.tags) - set(want):
                w.apply_tag(cid, tag, False, None)
            for tag in set(want) - set(commit.tags):
                w.apply_tag(cid, tag, True, None)
    if ref.head is not None:
        w.put_stream(ref.stream, ref.head, max(ref.seq, w.stream_seq(ref.stream)))


def missing_checkpoints(client: S3Client, index: Index, ref: refs.Ref) -> dict:
    """{id: (Commit, reused)} of the checkpoints the ref needs that the cache lacks: its live
    ones and the delta ancestors they need."""
    fetched: dict = {}
    with index.read() as r:
        have = {cid for cid in ref.live if r.checkpoint(cid) is not None}
        for cid in ref.live:
            current = cid
            while current is not None and current not in fetched and current not in have:
                if r.checkpoint(current) is not None:
                    break
                commit, reused = fetch_checkpoint(client, current)
                fetched[current] = (commit, reused)
                current = commit.parent if commit.kind != "full" else None
    return fetched


def pull_stream(client: S3Client, index: Index, stream: str) -> refs.Ref:
    """Brings the cache up to the stream's ref in the bucket; returns the ref."""
    ref = refs.read(client, stream)
    fetched = missing_checkpoints(client, index, ref)
    with index.write() as w:
        apply_ref(w, ref, fetched)
    return ref


def list_streams(client: S3Client) -> list[str]:
    """The streams that have a ref in the bucket."""
    out = []
    for obj in client.list(layout.REFS_DIR):
        stream = layout.stream_of_ref(obj.key)
        if stream is not None:
            out.append(stream)
    return out


def pull_all(client: S3Client, index: Index, skip: set = frozenset()) -> dict:
    """Pulls every stream of the bucket but those in `skip`; returns {stream: ref}."""
    return {stream: pull_stream(client, index, stream) for stream in list_streams(client)
            if stream not in skip}
