"""The index's writer gate: a flock() of STORE/index.gate (fmt.INDEX_GATE_FILE) beside the
index, on an open file of each thread's own, held by a writer from before it waits for
LMDB's write lock until its write transaction has ended (docs/design.md, "The lock files").

Why a gate before LMDB's own lock: LMDB's write lock is a process-shared robust mutex. One
whose holder dies is handed on (EOWNERDEAD), but a waiter SIGKILLed after the holder's unlock
woke it, before it took the lock, takes that wake-up with it: the other waiters sleep on
though the lock is free, until some later unlock (the many-writers kill test saw a compactor
wait over 120 s). A flock is the kernel's: its holder's death lets it go, and every waiter is
woken. So only the gate's holder is ever in LMDB's lock.

Why held for the whole transaction: so that a holder that stops inside it (SIGSTOP, Ctrl-Z,
a debugger) is seen by the waiters. The kernel names a flock's holder in /proc/locks (nothing
is written per transaction: a record written and cleared at each one cost a tiny commit 90
us). A waiter that finds the holder stopped at every look for max(timeout, STOPPED_GRACE)
seconds gives up with StoreLocked(lock="index") naming it, instead of waiting behind it for
ever (timeout: the store's, float("inf") waits). A holder that runs is waited for however
long its transaction takes: its writes are under way. Where /proc/locks does not name it (no
/proc, another pid namespace, a file system whose locks it lists under other inodes) a waiter
waits as before.

Waiting: a waiter first polls for POLL_SECONDS, yielding the CPU between tries (most waits are
one short transaction: 4 processes of tiny commits ran 5-10% faster so than when they waited
in LMDB's lock), then waits in the kernel's queue on a thread of its own (flock has no
timeout), looking at the holder every WATCH_SECONDS.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from typing import Iterator

from snapstore.engine import format as fmt
from snapstore.engine.fsutil import try_flock
from snapstore.errors import StoreIOError, StoreLocked
from snapstore.interrupts import start_thread

STOPPED_GRACE = 2.0     # seconds a holder must be seen stopped before a waiter gives up:
                        # a profiler (py-spy) or a debugger's attach stops a process briefly
WATCH_SECONDS = 0.25    # how often a waiter looks at the holder
POLL_SECONDS = 0.002    # a waiter polls (yielding the CPU) this long before it waits in a thread


class WriterGate:
    """The gate of one store in this process (writer_gate gives it out, one per store).

    Each thread flocks an open file of its own (opened once, kept): two threads of this
    process exclude each other as two processes do, so no lock of the process is needed, and
    letting go is an explicit LOCK_UN of the thread's own file, which does nothing when it
    holds nothing. So Ctrl-C needs no guarded sections (a signal handler swapped around each
    step cost a tiny commit 125 us): held()'s finally unlocks until it has (an interrupt
    landing in it is raised after), and an interrupt while taking the lock leaves nothing
    held that the finally does not let go."""

    def __init__(self, path: str, file_mode: int) -> None:
        self.path, self.file_mode = path, file_mode
        self._local = threading.local()     # .fd (this thread's file), .depth, .generation

    def _thread_file(self) -> tuple[object, int | None]:
        """(this thread's state, its open file of the gate; None where the file cannot be
        created: a read-only store, whose index nobody writes: LMDB's lock alone)."""
        local = self._local
        if getattr(local, "generation", None) != _FORKS[0]:     # new, or a fork()ed child
            local.generation, local.file, local.depth = _FORKS[0], None, 0
        if local.file is None:
            try:
                local.file = _ThreadFile(os.open(self.path,
                                                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                                 self.file_mode))
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                    raise self._io_error(exc) from exc
                return local, None
        return local, local.file.fd

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        """Holds the gate for the block (the caller begins and ends its write transaction in
        it). Raises StoreLocked when the holder stays stopped (above), StoreIOError when the
        gate file cannot be locked. A thread that holds the gate already passes (a write
        that opens a replaced index's databases inside another's block)."""
        local, fd = self._thread_file()
        if local.depth:
            local.depth += 1
            try:
                yield
            finally:
                local.depth -= 1
            return
        started, pid = time.monotonic(), os.getpid()
        waiter: list = []               # a waiter whose file holds the lock for us
        try:
            if fd is not None:
                self._take_flock(fd, started, timeout, waiter)
            local.depth = 1
            yield
        finally:
            if os.getpid() == pid:      # (a fork()ed child's copy of the block does nothing)
                _let_go(local, fd, waiter)

    def _take_flock(self, fd: int, started: float, timeout: float, waiter: list) -> None:
        """Takes the flock: on this thread's file when the gate is free, else on the file of
        a thread that waited in the kernel's queue (woken at once when the gate is let go;
        flock has no timeout of its own) while this one looked at the holder (waiter gets
        it)."""
        if _try_flock(fd, self):
            return
        # most waits are one short transaction of another writer: polled for a little first
        # (a thread of its own costs more than the wait)
        poll_until = time.monotonic() + POLL_SECONDS
        while time.monotonic() < poll_until:
            os.sched_yield()
            if _try_flock(fd, self):
                return
        watch = _StoppedWatch(self, started, timeout)
        # (the waiter puts itself in `waiter` before its thread starts: held()'s finally
        # abandons it whatever happens, which lets go once it gets the lock, or at once)
        waiting = _FlockWaiter(self.path, waiter)
        while not waiting.wait(WATCH_SECONDS):
            watch.look()
        if waiting.error is not None:
            raise self._io_error(waiting.error) from waiting.error

    def holder(self) -> int | None:
        """The pid of the gate's holder as /proc/locks names it (None when unknown)."""
        _, fd = self._thread_file()
        return None if fd is None else flock_holder(fd)

    def _io_error(self, exc: OSError) -> StoreIOError:
        return StoreIOError(f"cannot lock {self.path}: {exc.strerror}", exc.errno)


class _ThreadFile:
    """A thread's open file of a gate, closed when the thread ends (its threading.local
    goes), never by a fork()ed child's copy of it (_forget_gates closed those)."""
    __slots__ = ("fd", "generation", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd, self.generation = fd, _FORKS[0]
        _OPEN_FILES.add(fd)

    def __del__(self) -> None:
        if self.generation == _FORKS[0] and self.fd in _OPEN_FILES:
            _close_file(self.fd)        # (held by nothing now: held() let it go)


def _try_flock(fd: int, gate: WriterGate) -> bool:
    try:
        return try_flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise gate._io_error(exc) from exc      # noqa: SLF001 (this module's own class)


def _let_go(local, fd: int | None, waiter: list) -> None:
    """held()'s finally: the thread's depth back to 0 and an explicit LOCK_UN of its file and
    of a waiter's it got the lock through (which frees it whoever else has the open file: a
    fork()ed child keeps a copy of every descriptor, and closing ours alone left the gate
    locked for as long as the child lived). LOCK_UN of a file that holds nothing does
    nothing, so it is done until done: a KeyboardInterrupt landing here is raised after."""
    interrupted = None
    while True:
        try:
            local.depth = 0
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            while waiter:
                waiter[0].abandon()     # unlocks and closes its file (idempotent)
                waiter.pop()
            break
        except KeyboardInterrupt as exc:
            interrupted = interrupted or exc
        except OSError:
            break                       # (EBADF: nothing of ours is held by it)
    if interrupted is not None:
        raise interrupted


class _StoppedWatch:
    """Raises StoreLocked once the gate's holder was seen stopped at every look for
    max(timeout, STOPPED_GRACE) seconds."""

    def __init__(self, gate: WriterGate, started: float, timeout: float) -> None:
        self.gate, self.started, self.timeout = gate, started, timeout
        self.stopped_since: float | None = None
        self.pid: int | None = None

    def look(self) -> None:
        pid = self.gate.holder()
        if pid is None or pid == os.getpid() or not _stopped(pid):
            self.stopped_since = None
            return
        now = time.monotonic()
        if self.stopped_since is None or pid != self.pid:
            self.stopped_since, self.pid = now, pid
        if now - self.stopped_since < max(self.timeout, STOPPED_GRACE):
            return
        waited = now - self.started
        exc = StoreLocked("", path=os.path.dirname(self.gate.path), waited=waited,
                          lock="index", pid=pid, host=os.uname().nodename)
        exc.reason = (f"{exc.path}: the index's write lock is held by {exc.holder}, which is "
                      f"stopped (SIGSTOP, Ctrl-Z or a debugger; waited {waited:.1f} s, "
                      f"{now - self.stopped_since:.1f} s of them with it stopped).")
        exc.args = (f"{exc.reason} Let it go on (kill -CONT {pid}) or end it; pass "
                    "timeout=SECONDS (float('inf'): for ever) to wait longer for it.",)
        raise exc


def flock_holder(fd: int) -> int | None:
    """The pid /proc/locks names as the holder of an exclusive flock of fd's file (None: no
    holder listed, or no /proc/locks)."""
    try:
        st = os.fstat(fd)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}".encode()
        with open("/proc/locks", "rb") as f:
            for line in f:
                fields = line.split()
                # "1: FLOCK ADVISORY WRITE <pid> <maj:min:ino> 0 EOF"; a waiter's line has
                # "->" after the number
                if len(fields) >= 6 and fields[1] == b"FLOCK" and fields[3] == b"WRITE" \
                        and fields[5] == key:
                    pid = int(fields[4])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T) or stopped by its tracer (t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 1:].split()    # the name in parentheses may hold spaces
    return bool(fields) and fields[0] in (b"T", b"t")


class _FlockWaiter:
    """A thread blocked in flock(LOCK_EX) on an open file of its own. Abandoned (its caller
    gave up), it lets the lock go as soon as it gets it. Its caller waits on a one-shot lock
    (one C call: Event.wait, a Condition's, could be cut by Ctrl-C half way, wakeups.py)."""

    def __init__(self, path: str, owners: list) -> None:
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreIOError(f"cannot open {path}: {exc.strerror}", exc.errno) from exc
        _OPEN_FILES.add(self.fd)
        self._signal = threading.Lock()
        self._signal.acquire()              # released once the flock is taken (or failed)
        self.error: OSError | None = None
        self._lock = threading.Lock()
        self._abandoned = self._finished = self._closed = False
        owners.append(self)             # before its thread can take the lock through it
        start_thread(threading.Thread(target=self._wait, name="snapstore-index-gate",
                                      daemon=True))

    def wait(self, seconds: float) -> bool:
        """Whether the flock was taken (or failed: error) within `seconds`."""
        return self._signal.acquire(timeout=seconds)

    def _wait(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            self.error = exc
        with self._lock:
            self._finished = True
            if self._abandoned:
                self._let_go()
            else:
                self._signal.release()

    def abandon(self) -> None:
        """Lets the lock go once the thread gets it, or now if it has (idempotent)."""
        with self._lock:
            self._abandoned = True
            if self._finished:
                self._let_go()

    def _let_go(self) -> None:
        if self._closed:
            return
        try:
            if self.error is None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        except OSError:
            pass
        self._closed = True
        _close_file(self.fd)


_OPEN_FILES: set[int] = set()       # the threads' and waiters' open files of every gate:
                                    # a fork()ed child closes its copies
_FORKS = [0]                        # forks into this process: a thread's file of another
                                    # generation is its parent's


def _close_file(fd: int) -> None:
    _OPEN_FILES.discard(fd)
    try:
        os.close(fd)
    except OSError:
        pass


_GATES: dict[str, WriterGate] = {}
_GATES_LOCK = threading.Lock()


def writer_gate(index_path: str, file_mode: int) -> WriterGate:
    """The gate of the index at index_path (one per store and process)."""
    path = os.path.join(os.path.dirname(os.path.abspath(index_path)), fmt.INDEX_GATE_FILE)
    with _GATES_LOCK:
        gate = _GATES.get(path)
        if gate is None:
            gate = _GATES[path] = WriterGate(path, file_mode)
        return gate


def _forget_gates() -> None:
    """In a fork()ed child: the parent's open files of the gates are closed, never unlocked
    (LOCK_UN would let go of a lock the parent holds); each thread opens its own again."""
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()      # a thread of the parent may have held it at the fork
    _FORKS[0] += 1
    for fd in list(_OPEN_FILES):
        _close_file(fd)


os.register_at_fork(after_in_child=_forget_gates)
