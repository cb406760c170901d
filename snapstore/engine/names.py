"""Checkpoint names: the one resolver that turns what a caller calls a checkpoint into that
checkpoint, over one read-only index snapshot (Store.resolve and every Store method, the object
layers' load and the CLI use it).

A name is one of, in this order of precedence:

    42               an int: the checkpoint id (one index lookup; the CLI reads a string of
                     digits as an id)
    "latest"         the newest checkpoint of the store (the highest id)
    "latest:S"       the newest checkpoint of stream S (S verbatim: it may hold ':' or '@')
    "tag:T"          the checkpoint tagged T (T verbatim: "tag:x@1" is the tag "x@1")
    "dcp:D"          the DCP checkpoint saved with checkpoint_id D (the newest such of each
                     stream: a DCP re-save under the same id supersedes the earlier one, as
                     dcp.load reads it)
    "S@N"            the checkpoint of stream S with seq N (CheckpointInfo.seq), N digits; the
                     string is split at its last '@', so "a@b@3" is seq 3 of stream "a@b"
    any other str    looked up as a tag, a stream name (its newest checkpoint) and a DCP
                     checkpoint_id at once

A name must denote exactly one checkpoint: when the lookups of a plain name (or the
checkpoints tagged T) give several distinct checkpoints, AmbiguousCheckpointName lists them; a
tag on several checkpoints is ambiguous too, even within one stream (tags are labels the user
sets: taking the newest silently could delete or restore the wrong one). Nothing found:
CheckpointNotFound saying what was looked for. The explicit forms reach what a name that
looks like syntax hides: a stream named "latest" or "x@2" through "latest:latest",
"latest:x@2" and "x@2@N"; a tag or DCP id that looks like syntax through "tag:" / "dcp:".
A stream whose name begins with "tag:" or "dcp:" is reached through "latest:S" for its
newest checkpoint, and by id for the others ("S@N" is read as a tag or DCP id).

Cost: an id, "latest" and "latest:S" are index lookups; "S@N" reads the keys of stream S and
decodes O(log n) of its checkpoints (seqs grow with ids within a stream); tags and DCP
checkpoint_ids are not indexed, so a plain name or "tag:"/"dcp:" walks every checkpoint's
record, decoding only those whose bytes mention the name (IndexView.checkpoints_mentioning:
about 13 ms per 10,000 checkpoints; docs/design.md, "Names").
"""
from __future__ import annotations

import bisect
from typing import Any, NamedTuple

from snapstore.engine import format as fmt
from snapstore.engine.index import IndexView
from snapstore.engine.records import Commit
from snapstore.engine.validation import validate_checkpoint_id, validate_name
from snapstore.errors import (AmbiguousCheckpointName, CheckpointNotFound,
                              InvalidArgumentError, InvalidArgumentTypeError)

LATEST = "latest"
LATEST_PREFIX = "latest:"
TAG_PREFIX = "tag:"
DCP_PREFIX = "dcp:"
SEQ_SEPARATOR = "@"

# How a name matched a checkpoint (AmbiguousCheckpointName.candidates[...]["match"]).
MATCH_TAG = "tag"
MATCH_STREAM = "stream"
MATCH_DCP = "dcp checkpoint_id"

NAME_FORMS = ("an id, 'latest', 'latest:STREAM', 'STREAM@SEQ', a tag ('tag:T'), a stream name "
              "(its newest checkpoint) or a DCP checkpoint_id ('dcp:ID')")


class Query(NamedTuple):
    """What a name asks for: kind ("id", "latest", "stream", "seq", "tag", "dcp", "any") and
    its arguments (id, stream, seq, text)."""
    kind: str
    id: int | None = None
    stream: str | None = None
    seq: int | None = None
    text: str | None = None


def parse(name: Any) -> Query:
    """The Query a name stands for (no store needed). Raises InvalidArgumentTypeError for a
    name that is neither an int nor a str, InvalidArgumentError for an invalid id or an empty
    name."""
    if isinstance(name, bool) or not isinstance(name, (int, str)):
        raise InvalidArgumentTypeError(f"a checkpoint name must be an int id or a str "
                                       f"({NAME_FORMS}), got {type(name).__name__}")
    if isinstance(name, int):
        return Query("id", id=validate_checkpoint_id(name))
    _check_text(name, "a checkpoint name")
    if name == LATEST:
        return Query("latest")
    if name.startswith(LATEST_PREFIX):
        return Query("stream", stream=validate_name(name[len(LATEST_PREFIX):], "stream"))
    if name.startswith(TAG_PREFIX):
        return Query("tag", text=validate_name(name[len(TAG_PREFIX):], "tag"))
    if name.startswith(DCP_PREFIX):
        return Query("dcp", text=_check_text(name[len(DCP_PREFIX):], "DCP checkpoint_id"))
    stream, sep, seq = name.rpartition(SEQ_SEPARATOR)
    if sep and stream and seq.isascii() and seq.isdigit():
        return Query("seq", stream=validate_name(stream, "stream"), seq=int(seq))
    return Query("any", text=name)


def _check_text(text: str, what: str) -> str:
    """A non-empty str of valid Unicode (DCP checkpoint_ids have no length limit; streams and
    tags do, validate_name)."""
    if not text:
        raise InvalidArgumentError(f"{what} must not be empty ({NAME_FORMS})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} must be valid Unicode text (no lone surrogates), "
                                   f"got {text!r}") from None
    return text


def _is_name(text: str) -> bool:
    """True if text could be a stream's or a tag's name (validate_name accepts it)."""
    try:
        validate_name(text, "name")
    except InvalidArgumentError:
        return False
    return True


def resolve(view: IndexView, name: Any) -> Commit:
    """The checkpoint `name` names in this index snapshot (module docstring). Raises
    InvalidArgumentTypeError / InvalidArgumentError for a malformed name, CheckpointNotFound,
    AmbiguousCheckpointName."""
    q = parse(name)
    if q.kind == "id":
        commit = view.checkpoint(q.id)
        if commit is None:
            raise CheckpointNotFound(f"no checkpoint {q.id}")
        return commit
    if q.kind == "latest":
        last = view.last_checkpoint_id()
        if last is None:
            raise CheckpointNotFound("the store has no checkpoints (so no 'latest')")
        return _existing(view, last)
    if q.kind == "stream":
        head = view.stream_head(q.stream)
        if head is None:
            raise CheckpointNotFound(f"stream {q.stream!r} has no checkpoints")
        return _existing(view, head)
    if q.kind == "seq":
        return _by_seq(view, q.stream, q.seq)
    matches = _matches(view, q.text, tags=q.kind in ("tag", "any"),
                       dcp=q.kind in ("dcp", "any"), stream=q.kind == "any")
    if len(matches) == 1:
        return next(iter(matches.values()))[0]
    if not matches:
        raise CheckpointNotFound(_not_found(q))
    candidates = [{"id": c.id, "stream": c.stream, "seq": c.seq, "match": "+".join(how)}
                  for c, how in sorted(matches.values(), key=lambda m: m[0].id)]
    listed = ", ".join(f"{d['id']} ({d['stream']}@{d['seq']}, {d['match']})"
                       for d in candidates)
    raise AmbiguousCheckpointName(
        f"{name!r} names {len(candidates)} checkpoints: {listed}; name one by its id or "
        "STREAM@SEQ", name=name, candidates=candidates)


def _existing(view: IndexView, checkpoint_id: int) -> Commit:
    return view.named_checkpoint(checkpoint_id, "a stream's checkpoint list")


def _by_seq(view: IndexView, stream: str, seq: int) -> Commit:
    """The checkpoint of the stream with that seq: seqs grow with ids within a stream, so a
    binary search over the stream's ids decodes O(log n) checkpoints."""
    ids = view.checkpoint_ids(stream)
    if not ids:
        whole = f"{stream}{SEQ_SEPARATOR}{seq}"
        if view.stream_head(whole) is not None:
            hint = (f"a stream named {whole!r} exists: its newest checkpoint is "
                    f"{LATEST_PREFIX}{whole}, its checkpoint of seq N {whole}{SEQ_SEPARATOR}N")
        else:
            hint = (f"a tag or DCP checkpoint_id with '{SEQ_SEPARATOR}' is named "
                    f"{TAG_PREFIX}NAME or {DCP_PREFIX}NAME")
        raise CheckpointNotFound(f"no stream {stream!r} (for {whole}: STREAM{SEQ_SEPARATOR}SEQ; "
                                 f"{hint})")
    at = bisect.bisect_left(ids, seq, key=lambda i: _existing(view, i).seq)
    if at < len(ids):
        commit = _existing(view, ids[at])
        if commit.seq == seq:
            return commit
    raise CheckpointNotFound(f"stream {stream!r} has no checkpoint with seq {seq} (deleted, or "
                             f"not taken yet: its newest is seq {view.stream_seq(stream)})")


def _matches(view: IndexView, text: str, *, tags: bool, dcp: bool,
             stream: bool) -> dict[int, tuple[Commit, list]]:
    """{id: (checkpoint, [how it matched])} of the checkpoints `text` names as a tag, a DCP
    checkpoint_id (the newest per stream) and a stream name (its head), as asked."""
    found: dict[int, tuple[Commit, list]] = {}

    def add(commit: Commit, how: str) -> None:
        found.setdefault(commit.id, (commit, []))[1].append(how)

    if stream and _is_name(text):
        head = view.stream_head(text)
        if head is not None:
            add(_existing(view, head), MATCH_STREAM)
    if tags or dcp:
        newest_dcp: dict[str, Commit] = {}
        for commit in view.checkpoints_mentioning(text):
            if tags and text in commit.tags:
                add(commit, MATCH_TAG)
            if dcp and dcp_checkpoint_id(commit.meta) == text:
                newest_dcp[commit.stream] = commit      # ids ascend: the last is the newest
        for commit in newest_dcp.values():
            add(commit, MATCH_DCP)
    return found


def dcp_checkpoint_id(meta: Any) -> str | None:
    """The DCP checkpoint_id a checkpoint's (raw) meta records, or None."""
    if isinstance(meta, dict):
        dcp = meta.get(fmt.DCP_META_KEY)
        if isinstance(dcp, dict) and isinstance(dcp.get("checkpoint_id"), str):
            return dcp["checkpoint_id"]
    return None


def _not_found(q: Query) -> str:
    if q.kind == "tag":
        return f"no checkpoint is tagged {q.text!r}"
    if q.kind == "dcp":
        return f"no DCP checkpoint has checkpoint_id {q.text!r}"
    hint = f" (an id is an int: {int(q.text)}, not {q.text!r})" \
        if q.text.isascii() and q.text.isdigit() else ""
    return f"no checkpoint, tag, stream or DCP checkpoint_id named {q.text!r}{hint}"
