"""What checkpoints need of an S3 store's bucket: their checkpoint objects, those of the delta
ancestors they need (parents followed while a checkpoint is incremental: a live checkpoint's
object is a delta of its parent's as committed, whatever was deleted since), and the
segments the chunks of all of them lie in (each object's new-chunk table and reused-chunk
table locate every chunk its extents name). gc.py marks with it from every ref's live
checkpoints; gcguard.py finds, from the checkpoints a cache holds, where their chunks lie.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

from snapstore.engine import format as fmt
from snapstore.engine.records import Commit
from snapstore.remote import sync
from snapstore.remote.s3client import S3Client

FETCH_THREADS = 16


def chains(client: S3Client, ids: Iterable[int],
           memo: dict | None = None) -> dict[int, tuple[Commit, bytes]]:
    """{id: (Commit, reused-chunk table)} of the checkpoints `ids` and every delta ancestor
    they need. `memo` holds objects already fetched ({id: (Commit, reused)}, filled in;
    objects are immutable, so a memo stays valid). Fetches in parallel, level by level.
    Raises CorruptionError when an object is missing or damaged."""
    memo = {} if memo is None else memo
    out: dict[int, tuple[Commit, bytes]] = {}
    frontier = set(ids)
    with ThreadPoolExecutor(FETCH_THREADS, "snapstore-reach") as pool:
        while frontier:
            todo = sorted(i for i in frontier if i not in memo)
            for cid, obj in zip(todo, pool.map(lambda i: sync.fetch_checkpoint(client, i),
                                               todo)):
                memo[cid] = obj
            parents = set()
            for cid in frontier:
                out[cid] = memo[cid]
                commit = memo[cid][0]
                if commit.kind != "full" and commit.parent is not None:
                    parents.add(commit.parent)
            frontier = parents - out.keys()
    return out


def chunk_locations(commit: Commit, reused: bytes) -> Iterator[tuple]:
    """(chunk id, segment, offset, stored length, raw length, codec) of every chunk the
    checkpoint's extents name: its new-chunk table, then its reused-chunk table."""
    yield from fmt.NEW_CHUNK.iter_unpack(commit.new_chunks)
    yield from fmt.NEW_CHUNK.iter_unpack(reused)


def segments(objects: Iterable[tuple[Commit, bytes]]) -> set[int]:
    """The segments the chunks of these checkpoint objects lie in."""
    out: set[int] = set()
    for commit, reused in objects:
        out.update(loc[1] for loc in chunk_locations(commit, reused))
    return out
