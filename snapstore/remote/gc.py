"""Garbage collection of an S3 store, without a lock: mark, wait a grace period, delete what
is still unreachable (docs/design.md, "Garbage collection", which states the same argument).

A run (collect):
1. reads the pending mark (gc/pending.json, gcmark.py); it is due when its `due` time has
   passed (on this machine's clock);
2. marks: lists refs/ (after step 1) and reads every ref; the objects of every live
   checkpoint and of the delta ancestors it needs (reach.chains) are the reachable
   checkpoint objects, the segments their new-chunk and reused-chunk tables name the
   reachable segments. snapstore.json, refs/ and logs/ are never deleted (log numbers, and
   the segment numbers made from them, must never be taken twice: caches key segment bytes
   by number);
3. lists segments/, checkpoints/ and groups/. Candidates: segments and checkpoint objects
   not reachable and older than `grace` by the server's LastModified (whose 1 s resolution
   is added to the age asked for), and objects under groups/ older than 2 * grace
   (abandoned group commits);
4. no mark yet: writes one with the candidates (If-None-Match: *). A due mark: its objects
   that this run found unreachable (and that were not written again since the mark) are
   deleted: first the new mark replaces the old one (If-Match: exactly one run deletes a
   mark's objects) naming the candidates and them, then they are deleted. A mark not due
   yet: nothing is written or deleted (a mark replaced at every run would never come due);
5. aborts the store's multipart uploads begun more than `grace` ago;
6. deletes upload intents (intents/, remote/intents.py) older than
   layout.GC_INTENT_SECONDS or 2 * grace, without a mark (_delete_intents says why).
A mark's `due` is its time plus the larger of its grace and the grace writers assumed
before it (the replaced mark's, or layout.DEFAULT_GC_GRACE_SECONDS for the first mark): a
smaller grace takes effect only once writers that read the larger one are done.

Why nothing a commit can still name is deleted (docs/design.md says the same). A writer's
commit (gcguard.py) starts at s, before it plans against its cache, and reads the mark; it
reads the mark again at r, after its uploads, before it creates its checkpoint object; its
ref write lands at c. It does not commit (W1) with a reused chunk in a segment the mark
names or that is missing from the bucket, (W2) with one of its own new segments named by
the mark, (W3) when c - s would exceed g / 2, g the smallest grace of the marks it read
(the default when there was none). Marks form one sequence (each replaces the one before).
(L) Every mark written after a time s is due after s + g_s, g_s the grace of the mark
current at s (the default if none): the first one written after s replaces that mark, so
its due is at least its at + g_s, and later ones come later. Let X be an object a commit C
names itself (a segment its chunk tables name, or C's object; what its delta ancestors
name, their commits named, and C's parent, live in the ref from before s until c, keeps it
reachable), and let run R delete X, from mark M, while C needs it; take C the first commit
for which this happens. R lists refs/ once M is due: had C's ref write landed before that,
R would have read it and kept X. So c > M.due.
- If M was written after s, then c - s > M.due - s > g_s >= g by (L): W3 refused.
- Else M was current or older at s. From M until X is gone every mark names X: M does, R's
  replacement does, and a mark written while X still exists (R stalled before deleting)
  finds it unreachable and old. So the mark read at r names X (W1, W2 refuse) or X was gone
  at r (W1 refuses a missing reused segment). And X is not one of C's own new segments,
  nor C's object: those came into being after s, after M was listed. (A group's commit
  names new segments its parts uploaded before its s: W2 also refuses one of those that is
  missing at r, and one present at r is not deleted yet, so the mark read at r names it.)
The bounds keep g / 2 of slack for the latency of a mark's and of a ref's write and for
clock differences between the machines running gc, the writers' and the server's
LastModified; they must stay well below it (milliseconds against the default hour).
"""
from __future__ import annotations

import time

from snapstore.remote import gcmark, layout, reach, refs, sync
from snapstore.remote.s3client import ObjectInfo, S3Client

_DUE_MARGIN = 0.05          # wait=True: seconds slept past a mark's due time


def _listing(client: S3Client, directory: str, parse) -> dict:
    """{parsed key: ObjectInfo} of the objects under directory whose keys parse."""
    out = {}
    for obj in client.list(directory):
        name = parse(obj.key)
        if name is not None:
            out[name] = obj
    return out


def _group_key(key: str) -> str | None:
    return key if key.startswith(layout.GROUPS_DIR) and key != layout.GROUPS_DIR else None


def mark(client: S3Client, memo: dict | None = None) -> dict:
    """What the refs reach now: {"live": ids, "checkpoints": reachable ids, "segments":
    reachable segment numbers}. Raises CorruptionError when a ref or a needed checkpoint
    object is damaged or missing (then nothing may be deleted)."""
    live: set[int] = set()
    for stream in sync.list_streams(client):
        live.update(refs.read(client, stream).live)
    objects = reach.chains(client, live, memo)
    return {"live": live, "checkpoints": set(objects),
            "segments": reach.segments(objects.values())}


def _old(obj: ObjectInfo, now: float, age: float) -> bool:
    return now - obj.modified >= age + layout.MODIFIED_RESOLUTION


def _run(client: S3Client, grace: float, dry_run: bool, memo: dict) -> dict:
    now = time.time()
    pending = gcmark.read(client)
    due = pending is not None and now >= pending.due
    reached = mark(client, memo)
    segments = _listing(client, layout.SEGMENTS_DIR, layout.segment_of)
    checkpoints = _listing(client, layout.CHECKPOINTS_DIR, layout.checkpoint_id_of)
    groups = _listing(client, layout.GROUPS_DIR, _group_key)
    now = time.time()
    candidates = {
        "segments": {n for n, o in segments.items()
                     if n not in reached["segments"] and _old(o, now, grace)},
        "checkpoints": {i for i, o in checkpoints.items()
                        if i not in reached["checkpoints"] and _old(o, now, grace)},
        "groups": {k for k, o in groups.items()
                   if _old(o, now, layout.GC_GROUP_GRACES * grace)}}
    doomed = {"segments": set(), "checkpoints": set(), "groups": set()}
    if due:
        # Still unreachable, and not written again since the mark (its keys are never
        # reused, so this only guards against what the protocol rules out).
        def still(found: dict, marked, reachable=frozenset()):
            return {k for k in marked if k in found and k not in reachable
                    and found[k].modified <= pending.at}
        doomed = {"segments": still(segments, pending.segments, reached["segments"]),
                  "checkpoints": still(checkpoints, pending.checkpoints,
                                       reached["checkpoints"]),
                  "groups": still(groups, pending.groups)}
    next_id = max([pending.next_id if pending else 0] + [i + 1 for i in checkpoints])
    report = {"checkpoints_live": len(reached["live"]),
              "checkpoints_reachable": len(reached["checkpoints"]),
              "segments_reachable": len(reached["segments"]),
              "dry_run": dry_run, "raced": False}
    write_mark = pending is None or due
    if write_mark:
        at = time.time()
        new = gcmark.Mark(at, grace, at + max(grace, gcmark.writers_grace(pending)), next_id,
                          frozenset(candidates["segments"] | doomed["segments"]),
                          frozenset(candidates["checkpoints"] | doomed["checkpoints"]),
                          frozenset(candidates["groups"] | doomed["groups"]))
        if not dry_run:
            try:
                new = gcmark.write(client, new, pending)
            except gcmark.MarkRaced:
                report["raced"] = True       # another run is collecting: leave it to it
                new = None
                doomed = {"segments": set(), "checkpoints": set(), "groups": set()}
    else:
        new = pending
    if not dry_run and any(doomed.values()):
        client.delete([layout.segment_key(n) for n in sorted(doomed["segments"])]
                      + [layout.checkpoint_key(i) for i in sorted(doomed["checkpoints"])]
                      + sorted(doomed["groups"]))
    sizes = {"segments": segments, "checkpoints": checkpoints, "groups": groups}

    def described(what: dict) -> dict:
        out = {kind: sorted(keys) for kind, keys in what.items()}
        out["bytes"] = sum(sizes[kind][k].size for kind, keys in what.items()
                           for k in keys if k in sizes[kind])
        return out
    waiting = {"segments": new.segments, "checkpoints": new.checkpoints,
               "groups": new.groups} if new is not None else {}
    report["marked"] = described({kind: set(waiting.get(kind, ())) - doomed[kind]
                                  for kind in doomed})
    report["deleted"] = described(doomed)
    report["bytes_deleted"] = report["deleted"]["bytes"]
    report["mark_written"] = write_mark and not dry_run and not report["raced"]
    report["mark_at"] = new.at if new is not None else None
    report["due_at"] = new.due if new is not None else None
    report["aborted_uploads"] = 0 if dry_run else client.abort_uploads(
        older_than=time.time() - grace)
    report["intents_deleted"] = _delete_intents(client, grace, dry_run)
    return report


def _delete_intents(client: S3Client, grace: float, dry_run: bool) -> int:
    """Deletes the upload intents and outcomes (remote/intents.py) older than
    GC_INTENT_SECONDS or two graces, without a mark: an intent is read only within
    INTENT_LOOKBACK_SECONDS of its making and waited for at most a quarter of a grace after
    that, and one deleted early costs only a chunk uploaded twice. Returns how many."""
    age = max(layout.GC_INTENT_SECONDS, 2 * grace)
    now = time.time()
    stale = sorted(o.key for o in client.list(layout.INTENTS_DIR)
                   if layout.intent_millis(o.key) is not None and _old(o, now, age))
    if stale and not dry_run:
        client.delete(stale)
    return len(stale)


def collect(client: S3Client, *, grace: float, dry_run: bool = False,
            wait: bool = False) -> dict:
    """One gc run (see the module docstring); with wait, when the mark left behind names
    objects, sleeps until it is due and runs again, so what was marked is deleted in this
    call. Returns the report of the last run: checkpoints_live, checkpoints_reachable,
    segments_reachable, marked (what the mark in the bucket holds for a later run to
    delete, less what this run deleted: the mark names those too until they are gone) and
    deleted, each {"segments": [...], "checkpoints": [...], "groups": [...], "bytes": n},
    bytes_deleted, aborted_uploads and intents_deleted (summed over runs), mark_written,
    mark_at and due_at (the mark in the bucket after the run: what "marked" lists), raced
    (another run replaced the mark first: this one deleted nothing), runs, dry_run,
    seconds."""
    started = time.monotonic()
    memo: dict = {}                 # checkpoint objects are immutable: fetched once per call
    report = _run(client, grace, dry_run, memo)
    runs, aborted, intents = 1, report["aborted_uploads"], report["intents_deleted"]
    marked = report["marked"]
    if wait and not dry_run and report["due_at"] is not None and \
            any(marked[k] for k in ("segments", "checkpoints", "groups")):
        time.sleep(max(0.0, report["due_at"] - time.time()) + _DUE_MARGIN)
        report = _run(client, grace, dry_run, memo)
        runs, aborted = 2, aborted + report["aborted_uploads"]
        intents += report["intents_deleted"]
    report["aborted_uploads"] = aborted
    report["intents_deleted"] = intents
    report["runs"] = runs
    report["seconds"] = time.monotonic() - started
    return report
