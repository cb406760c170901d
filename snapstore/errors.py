"""Every exception snapstore raises: one hierarchy rooted at SnapstoreError, and the C-code table."""
from __future__ import annotations

import os as _os


class SnapstoreError(Exception):
    """Base class of every error snapstore raises on purpose."""


class InvalidArgumentError(SnapstoreError, ValueError):
    """An argument has the right type but a wrong value (sizes, page size, names, options)."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type. Also a TypeError (Python's convention) and an
    InvalidArgumentError, so one except clause catches every bad argument."""


class NativeError(SnapstoreError):
    """The C core returned an error code. Carries the C function name and code."""

    def __init__(self, message: str, *, function: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.function = function
        self.code = code


class NativeArgumentError(NativeError, InvalidArgumentError):
    """The C core rejected an argument (SNAP_EINVAL)."""


class NativeSpaceError(NativeError):
    """An output array given to the C core was too small (SNAP_ESPACE): a snapstore bug."""


class NativeStateError(NativeError):
    """A C object was used before it was initialised (SNAP_ESTATE): a snapstore bug."""


class NativeSystemError(NativeError, OSError):
    """A system call made by the C core failed (SNAP_ESYS: the dirty-tracking wrappers of
    csrc/uffd.c). ``errno`` and ``strerror`` are set as for OSError."""

    def __init__(self, message: str, *, function: str = "", code: int = 0,
                 errno_: int | None = None) -> None:
        NativeError.__init__(self, message, function=function, code=code)
        self.errno = errno_
        self.strerror = _os.strerror(errno_) if errno_ else message

    def __str__(self) -> str:  # OSError would print only "[Errno n] strerror"
        return str(self.args[0]) if self.args else self.strerror


class TrackingUnavailableError(SnapstoreError):
    """A dirty-tracking mode was asked for explicitly (e.g. mode="uffd") where it cannot work:
    the kernel lacks it or the memory cannot be protected. ``reason`` says why; mode="auto"
    falls back instead of raising."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class CheckpointNotFound(SnapstoreError, KeyError):
    """No checkpoint (or stream, or buffer) of that id or name exists in the store."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "checkpoint not found"


class AmbiguousCheckpointName(InvalidArgumentError):
    """A checkpoint name (a tag, a stream name or a DCP checkpoint_id: see Store.resolve) names
    more than one checkpoint. The message lists them; ``candidates`` holds them as dicts
    {"id", "stream", "seq", "match"} (match: how the name matched: "tag", "stream",
    "dcp checkpoint_id", joined with "+" when several ways). An InvalidArgumentError (the name
    does not identify a checkpoint: pick one by id, STREAM@SEQ, or tag:/dcp:/latest:), not a
    CheckpointNotFound: a caller treating CheckpointNotFound as "not there" must not take an
    ambiguous name for a missing one."""

    def __init__(self, message: str, *, name: str = "", candidates: tuple = ()) -> None:
        super().__init__(message)
        self.name = name
        self.candidates = list(candidates)


class CorruptionError(SnapstoreError):
    """Stored bytes do not match their checksum or id, or the index contradicts the log.

    Attributes name where: ``segment`` (file name) and ``offset`` when known; ``file`` (a
    path) instead of ``segment`` for damage in a file outside a store (a savepoint file).
    """

    def __init__(self, message: str, *, segment: str | None = None,
                 offset: int | None = None, file: str | None = None) -> None:
        where = ""
        if segment is not None or file is not None:
            where = (f" (segment {segment}" if segment is not None else f" (file {file}") + \
                (f", offset {offset}" if offset is not None else "") + ")"
        super().__init__(message + where)
        self.segment = segment
        self.offset = offset
        self.file = file


class DamagedRecord(CorruptionError):
    """A record of the log that fails validation (or whose content does not decode).
    ``reason`` is the bare message; ``end`` is where the record's header says it ends (None
    when the header itself is damaged)."""

    def __init__(self, reason: str, *, segment: str | None = None, offset: int | None = None,
                 end: int | None = None) -> None:
        super().__init__(reason, segment=segment, offset=offset)
        self.reason, self.end = reason, end


class NativeDataError(NativeError, CorruptionError):
    """Bytes given to the C core failed its checks (SNAP_EDATA: a damaged chunk record).
    read_chunks() reports it as a result, so the engine can name the record; check() raises
    it for any other caller."""


class NativeMemoryError(NativeError, MemoryError):
    """The C core could not allocate a library's context (SNAP_ENOMEM: zstd's)."""


class ConcurrentCompactionError(SnapstoreError):
    """A read raced compactions that moved the bytes it was reading: retry the read.

    Raised instead of returning anything when a segment the read had planned to use was
    removed meanwhile, each time it read again on a new snapshot (reads retry by
    themselves, up to reader.READ_ATTEMPTS times); a new read sees the moved data.
    """


class CommitConflict(SnapstoreError):
    """Another writer got there first: the commit (or delete, or tag) did not happen, and
    nothing of it is visible. Retry after reading the new state.

    A commit names the head of its stream it was made against (the head when it was planned,
    or ``expect_head=``); it fails with CommitConflict when that head moved, or when another
    writer has a commit of the same stream in progress. A delete or tag fails with it when a
    commit in progress builds on the checkpoint, or another delete or tag of it is in
    progress. Never rebased, so a lost update is never silent (docs/design.md, "Many
    writers").

    Attributes: ``stream`` (or None), ``expected`` (the head the commit was made against),
    ``found`` (the head it found, or None), ``holder`` (who holds a conflicting operation in
    progress, in words, or None)."""

    def __init__(self, message: str, *, stream: str | None = None, expected: int | None = None,
                 found: int | None = None, holder: str | None = None) -> None:
        super().__init__(message)
        self.stream, self.expected, self.found, self.holder = stream, expected, found, holder


class GroupError(SnapstoreError):
    """A group commit cannot go on: the group is unknown (never opened, committed, aborted or
    timed out), the participant is not one of the group's, or its buffers collide with
    another participant's. ``group`` names the group."""

    def __init__(self, message: str, *, group: str | None = None) -> None:
        super().__init__(message)
        self.group = group


class GroupTimeout(GroupError):
    """A group was not complete in time: the participants in ``missing`` never staged their
    parts. The group is aborted; nothing of it is visible, its staged parts are garbage."""

    def __init__(self, message: str, *, group: str | None = None, missing: tuple = ()) -> None:
        super().__init__(message, group=group)
        self.missing = tuple(missing)


class StoreLocked(SnapstoreError):
    """A lock this operation needs is held by someone else, past the time it was given to
    wait (``timeout`` of open(), of repair(); compact() and verify() wait up to the store's).

    Writers never lock each other out (each has a log of its own); ``lock`` says which of the
    store's locks stood in the way (docs/design.md, "The lock files"):
      "store"        STORE/lock is held exclusively by an operation that needs the store to
                     itself: creating it, upgrading its format, a repair, or a writer of
                     format 2 or older. A writer's open waits for it.
      "writers"      this operation needs the store to itself (repair, a format upgrade) and
                     writers have it open; the holder named is one of them, ``writers``
                     counts them.
      "maintenance"  STORE/maintenance: a compaction is running (a second compaction, or a
                     verify, waits for it); for a compaction, also verifies running.
      "index"        STORE/index.gate: the index's write lock is held by a process that is
                     stopped (SIGSTOP, Ctrl-Z, a debugger); a write gave up after seeing it
                     stopped for max(timeout, 2 s). A holder that runs is waited for.
    Attributes: ``path`` (the store), ``waited`` (seconds waited), ``lock``, ``writers``, and
    what the holder recorded in its lock file when it took the lock: ``pid``, ``host`` and
    ``since`` (ISO 8601 UTC time), each None when unknown (a holder that wrote no record, a
    torn or stale one). ``holder`` is them as words. ``reason`` is the message without its
    advice (what holds the lock, how long this waited), for callers that give their own
    advice (the command line's is --timeout)."""

    def __init__(self, message: str, *, path: str | None = None, pid: int | None = None,
                 host: str | None = None, since: str | None = None,
                 waited: float | None = None, lock: str | None = None, writers: int = 0,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.path, self.pid, self.host, self.since, self.waited = path, pid, host, since, waited
        self.lock, self.writers, self.reason = lock, writers, reason

    @property
    def holder(self) -> str:
        """Who holds the lock, in words: 'another process (pid 1234 on host x since
        2026-11-23T10:00:00Z)', 'another thread or Store object of this process (...)', or 'another
        process or Store object' when the lock file names no live holder."""
        if self.pid is None:
            return "another process or Store object"
        ours = self.pid == _os.getpid() and self.host in (None, _os.uname().nodename)
        who = "another thread or Store object of this process" if ours else "another process"
        return (f"{who} (pid {self.pid}" + (f" on host {self.host}" if self.host else "")
                + (f" since {self.since}" if self.since else "") + ")")


class FormatError(SnapstoreError):
    """The directory is not a snapstore store, or it was written by a newer format version."""


class DamagedFormatFileError(FormatError, CorruptionError):
    """The store's FORMAT file is damaged (unreadable, or it names no valid format version):
    a FormatError (the store cannot be opened as one) that is damage, not a usage error (the
    command line exits 1)."""


class StoreClosedError(SnapstoreError):
    """The store was closed; open it again."""


class ForkedStoreError(SnapstoreError):
    """The store was opened by another process: this one is a fork()ed child of it.

    A child inherits its parent's lock, LMDB environment and segment descriptors, which only
    the opening process may use; every call on such a Store (and on its trackers) raises this.
    Open the store again in the child (snapstore.open(path)): the child's own Store works.
    """


class ReadOnlyError(SnapstoreError):
    """A write was attempted on a store opened with readonly=True."""


class StoreIOError(SnapstoreError, OSError):
    """An I/O error (disk full, EIO, ...) while writing or reading the store.

    A checkpoint that fails with it leaves no visible trace; the store stays usable.
    """

    def __init__(self, message: str, errno_: int | None = None) -> None:
        SnapstoreError.__init__(self, message)
        self.errno = errno_
        self.strerror = message

    def __str__(self) -> str:      # OSError's would print "[Errno None] ..."
        return self.strerror



class RemoteError(StoreIOError):
    """A request to the object store (S3) failed for good: refused (403, 400, ...), or still
    failing after retries with bounded backoff for the store's ``remote_timeout``. Names the
    operation, the key and the last answer (``status``: the HTTP status, None for a
    connection error or timeout). Nothing half-done is visible: a checkpoint that fails with
    it was not committed (its uploads are garbage for gc)."""

    def __init__(self, message: str, *, operation: str = "", key: str = "",
                 status: int | None = None) -> None:
        super().__init__(message)
        self.operation, self.key, self.status = operation, key, status

class ExportError(InvalidArgumentError):
    """snapstore.export cannot write the checkpoint as asked: it holds no tensors, a dtype the
    format lacks (bfloat16 in npz), a name given twice, a sharded DCP tensor, an output file
    that exists (without force), or the format's library is not installed. Nothing was
    written."""


# ---- the object layers (snapstore.objects, snapstore.arrays, snapstore.torch) ----------------
class ObjectSaveError(SnapstoreError, TypeError):
    """An object (or a part of it, named by ``path``) cannot be pickled. Nothing was written."""

    def __init__(self, message: str, path: str = "obj") -> None:
        super().__init__(message)
        self.path = path


class DeviceTensorError(InvalidArgumentError):
    """A tensor is not on the CPU (named by ``path``); save(..., allow_device_copy=True)
    copies it to the CPU first. Nothing was written."""

    def __init__(self, message: str, path: str = "obj") -> None:
        super().__init__(message)
        self.path = path


class StructureMismatchError(InvalidArgumentError):
    """load(into=...) / load_arrays(into=...): the target's structure, shapes or dtypes differ
    from the checkpoint's (first difference at ``path``). Nothing was written; the target is
    unchanged."""

    def __init__(self, message: str, path: str = "obj") -> None:
        super().__init__(message)
        self.path = path


class NotAnObjectCheckpointError(InvalidArgumentError):
    """The checkpoint was not written by the loader's own save: store.load() needs a
    store.save() / snapstore.torch.save() checkpoint, load_arrays() a save_arrays() one. The
    message names the call that reads the checkpoint (load_arrays(), load(), restore()...)."""


# ---- workflows (snapstore.workflow) ----------------------------------------------------------
class StepError(SnapstoreError):
    """A workflow step raised. ``step`` and ``workflow_id`` name it; the step's exception is
    the ``__cause__``. The workflow's last checkpoint is unchanged; run() again retries the
    step."""

    def __init__(self, message: str, *, workflow_id: str = "", step: str = "") -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.step = step


class CheckpointSaveError(SnapstoreError):
    """The state after a workflow step could not be checkpointed (disk full, I/O error, closed
    store, ...). The workflow stopped; the error that caused it is the ``__cause__``."""

    def __init__(self, message: str, *, workflow_id: str = "", step: str = "") -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.step = step


class AsyncSaveError(SnapstoreError):
    """An earlier save_async() of the stream failed and its error had not been reported by a
    call yet: this call raises it (the ``__cause__``) once, before saving anything; the next
    call saves again (a full diff against the stream's head)."""

    def __init__(self, message: str, *, stream: str = "") -> None:
        super().__init__(message)
        self.stream = stream


class WorkflowConflictError(CommitConflict):
    """Another run of the same workflow id (another process, or another Workflow object)
    checkpointed the workflow while this run was going: this run stopped, and the state after
    its step ``step`` was not saved (nothing of it is visible), so the two runs' steps never
    interleave. ``workflow_id`` and ``step`` name it ("" for reset()); ``expected`` is the
    checkpoint this run resumed from or last wrote, ``found`` the workflow's newest (snapstore
    ids). The step may have run (its side effects happened); run() again resumes from the
    newest checkpoint. A CommitConflict, so ``except CommitConflict`` catches it too."""

    def __init__(self, message: str, *, workflow_id: str = "", step: str = "",
                 stream: str | None = None, expected: int | None = None,
                 found: int | None = None, holder: str | None = None) -> None:
        super().__init__(message, stream=stream, expected=expected, found=found,
                         holder=holder)
        self.workflow_id = workflow_id
        self.step = step


class WorkflowInputMismatchError(InvalidArgumentError):
    """Workflow.run(state) got an input other than the one the workflow's stored run was
    started with: run() resumes (or returns the result of) that run, so a different input
    would be silently ignored. run() with the same input or none resumes; rerun(state) starts a
    new run with the new input (history is kept); reset() forgets the runs."""

    def __init__(self, message: str, *, workflow_id: str = "") -> None:
        super().__init__(message)
        self.workflow_id = workflow_id


class WorkflowFinishedError(WorkflowInputMismatchError):
    """Workflow.run(state) on a finished workflow with an input other than the finished run's:
    use rerun(state) for a new run on the same workflow id, or reset() then run(state)."""


# C return code (SNAP_E*) -> exception class. The single source of truth for that mapping;
# the codes themselves come from the compiled library (snapstore._native checks them).
NATIVE_ERRORS: dict[str, type[NativeError]] = {
    "SNAP_EINVAL": NativeArgumentError,
    "SNAP_ESPACE": NativeSpaceError,
    "SNAP_ESTATE": NativeStateError,
    "SNAP_ESYS": NativeSystemError,
    "SNAP_EDATA": NativeDataError,
    "SNAP_ENOMEM": NativeMemoryError,
}
