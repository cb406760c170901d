"""Who holds which lock, and what StoreLocked says (issue 15: holders named in the lock files;
issue 16: many writers).

Writers never lock each other out: each flocks a log of its own (STORE/writers/<L>, holding
its record) and shares STORE/lock. StoreLocked comes only from what must run alone, each
case naming the holder that actually blocks it:
  * STORE/lock held exclusively (a store being created, a repair, a format upgrade, a writer
    of an older version) keeps writers out: lock "store", the holder from STORE/lock;
  * open writers keep repair out: lock "writers", the holder from a writers/<L> record;
  * a running compaction keeps a second one (and verify) out: lock "maintenance", the holder
    from STORE/maintenance.
The CLI gives its own advice (--timeout) for each; every writing command takes --timeout.
A real second process holds the lock in every test but the in-process ones."""
import calendar
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from cli_runner import ROOT, snapstore_cli

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import logowners
from snapstore.engine.holders import RECORD_BYTES, read_holder
from snapstore.errors import StoreLocked

HOST = os.uname().nodename

# A writer: shares STORE/lock, holds its log's lock with its record.
HOLD_STORE = """
import sys, snapstore
s = snapstore.open(sys.argv[1])
s.checkpoint({"x": b"from the holder"}, "holder")
print("ready", flush=True)
sys.stdin.read()
s.close()
"""

# An exclusive holder of STORE/lock that writes no record (a writer of an old version).
HOLD_RAW_FLOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
"""

# A writer as the lock files see it (shared STORE/lock, exclusive writers/<L>), whose log's
# lock file holds whatever the test wrote into it.
HOLD_RAW_WRITER = """
import fcntl, os, sys
store, log = sys.argv[1].rsplit(":", 1)
lock = os.open(os.path.join(store, "lock"), os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_SH)
mine = os.open(os.path.join(store, "writers", log), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(mine, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
"""

# STORE/lock taken exclusively as snapstore does: a store being created (a new directory), a
# repair or a format upgrade in progress (an existing store). Writes its record.
HOLD_EXCLUSIVE = """
import sys, time
from snapstore.engine.storedir import take_lock
fd = take_lock(sys.argv[1], time.monotonic())
print("ready", flush=True)
sys.stdin.read()
"""

# A compaction in progress: a writer inside the store's maintenance lock.
HOLD_COMPACTING = """
import sys, snapstore
s = snapstore.open(sys.argv[1])
with s._committer.maintenance(exclusive=True):
    print("ready", flush=True)
    sys.stdin.read()
s.close()
"""


class Holder:
    """A second process running one of the scripts above on `arg`; release() ends it."""

    def __init__(self, script: str, arg: str) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", script, arg], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def holders():
    started = []

    def start(script, arg):
        h = Holder(script, arg)
        started.append(h)
        return h
    yield start
    for h in started:
        if h.proc.poll() is None:
            h.kill()


@pytest.fixture
def path(tmp_path):
    """A store of two checkpoints, created (and closed) by this process: its first writer,
    log 0."""
    p = str(tmp_path / "s")
    with snapstore.open(p) as s:
        s.checkpoint({"x": b"1"}, "train")
        s.checkpoint({"x": b"2"}, "train")
    return p


def lock_file(path):
    return os.path.join(path, fmt.LOCK_FILE)


def record_of(name):
    """The JSON record in a lock file (as written: padded to RECORD_BYTES)."""
    with open(name, "rb") as f:
        data = f.read()
    assert len(data) == RECORD_BYTES
    return json.loads(data)


def holder_of(name):
    """read_holder of a lock file: {pid, host, since}, each None when unknown."""
    fd = os.open(name, os.O_RDONLY)
    try:
        return read_holder(fd)
    finally:
        os.close(fd)


def assert_recent(since):
    t = calendar.timegm(time.strptime(since, "%Y-%m-%dT%H:%M:%SZ"))
    assert time.time() - 120 <= t <= time.time() + 1


# ---- writers: never blocked by each other ------------------------------------------------
def test_a_second_writer_process_never_blocks_a_writer(path, holders):
    holder = holders(HOLD_STORE, path)
    t0 = time.monotonic()
    with snapstore.open(path, timeout=0) as s:           # no waiting: nothing is exclusive
        assert time.monotonic() - t0 < 5
        mine = s.checkpoint({"x": b"3"}, "train")
        assert mine.parent == 2
        s.tag(mine.id, "best")
        s.delete(1)
        assert {c.stream for c in s.checkpoints()} == {"train", "holder"}
        logs = dict(logowners.live_holders(path))
        assert len(logs) == 2 and s._committer.log_number in logs
        assert logs[s._committer.log_number]["pid"] == os.getpid()
        assert [h["pid"] for log, h in logs.items()
                if log != s._committer.log_number] == [holder.pid]


def test_each_log_lock_file_holds_its_writers_record(path, holders):
    holder = holders(HOLD_STORE, path)               # adopts log 0, the creator's (closed)
    with snapstore.open(path) as s, snapstore.open(path) as s2:
        mine = {s._committer.log_number, s2._committer.log_number}
        assert 0 not in mine and len(mine) == 2
        for log in sorted(logowners.lock_files(path)):
            record = record_of(logowners.lock_path(path, log))
            assert record["host"] == HOST
            assert_recent(record["since"])
            assert record["pid"] == (holder.pid if log == 0 else os.getpid())
    # STORE/lock names no writer: only an exclusive holder records itself there, and the
    # creator cleared its record when it shared the lock.
    assert os.path.getsize(lock_file(path)) == 0


# ---- an exclusive holder of STORE/lock keeps writers out --------------------------------
def test_an_exclusive_holder_blocks_writers_naming_it(path, holders):
    holder = holders(HOLD_EXCLUSIVE, path)           # a repair (or upgrade) in progress
    with pytest.raises(StoreLocked) as exc:
        snapstore.open(path, timeout=0.2)
    e = exc.value
    assert (e.pid, e.host, e.path, e.lock) == (holder.pid, HOST, path, "store")
    assert_recent(e.since)
    assert e.waited >= 0.2
    msg = str(e)
    assert msg.startswith(f"{path} is locked by another process (pid {holder.pid} on host "
                          f"{HOST} since {e.since}), which needs the store to itself "
                          "(creating it, upgrading its format, a repair, or a writer of an "
                          "older snapstore version; waited 0.2")
    assert msg == f"{e.reason} Open it with readonly=True to read meanwhile, or pass " \
                  "timeout=SECONDS to wait for the lock."
    assert "--timeout" not in msg                                 # Python advice in Python
    with snapstore.open(path, readonly=True) as reader:           # readers never wait
        assert reader.resolve("latest").id == 2


def test_timeout_waits_for_the_exclusive_holder(path, holders):
    holder = holders(HOLD_EXCLUSIVE, path)
    assert record_of(lock_file(path))["pid"] == holder.pid
    threading.Timer(0.5, holder.release).start()
    t0 = time.monotonic()
    with snapstore.open(path, timeout=30) as s:
        assert time.monotonic() - t0 >= 0.4
        assert s.checkpoint({"x": b"3"}, "train").parent == 2
        # a writer writes its record into its log's lock file, never into STORE/lock
        assert record_of(logowners.lock_path(path, s._committer.log_number))["pid"] == \
            os.getpid()
        assert record_of(lock_file(path))["pid"] == holder.pid
    holder.proc.wait(30)          # reaped (a zombie's pid still exists): the record is stale
    assert holder_of(lock_file(path)) == dict.fromkeys(("pid", "host", "since"))


def test_a_killed_exclusive_holder_never_blocks(path, holders):
    holder = holders(HOLD_EXCLUSIVE, path)
    holder.kill()                                    # its record stays in the lock file
    assert record_of(lock_file(path))["pid"] == holder.pid
    assert holder_of(lock_file(path))["pid"] is None     # stale: reads as unknown
    with snapstore.open(path, timeout=0) as s:       # the flock died with it
        assert s.resolve("latest").id == 2


def test_the_creator_is_not_named_after_it_shared_the_lock(path, holders):
    """The record in STORE/lock names an exclusive holder only while it holds the lock: a
    holder that writes none (an old version) reads as unknown, never as the store's creator
    (this process, still alive)."""
    assert os.path.getsize(lock_file(path)) == 0
    holders(HOLD_RAW_FLOCK, lock_file(path))
    with pytest.raises(StoreLocked) as exc:
        snapstore.open(path)
    assert (exc.value.pid, exc.value.host, exc.value.since) == (None, None, None)
    assert "locked by another process or Store object, which" in str(exc.value)


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


RECORDS = [
    b"", b"\0" * 300, b"\xff\xfe garbage", b'{"pid": 12', b"[1, 2, 3]", b"null",
    b'{"pid": "12", "host": "h", "since": "t"}', b'{"pid": true, "host": "h", "since": "t"}',
    b'{"pid": -4, "host": "h", "since": "t"}', b'{"pid": 5, "host": 7, "since": "t"}',
    b'{"pid": 5, "host": "h\\u001b[31m", "since": "t"}', b"{" * 5000,
    "stale"]


def a_record(record):
    if record == "stale":       # names a process of this host that is gone
        return json.dumps({"pid": dead_pid(), "host": HOST,
                           "since": "2020-01-01T00:00:00Z"}).encode()
    return record


@pytest.mark.parametrize("record", RECORDS)
def test_torn_garbage_or_stale_records_read_as_unknown(path, holders, record):
    with open(lock_file(path), "wb") as f:
        f.write(a_record(record))
    holders(HOLD_RAW_FLOCK, lock_file(path))        # a holder that writes no record
    with pytest.raises(StoreLocked) as exc:
        snapstore.open(path)
    assert (exc.value.pid, exc.value.host, exc.value.since) == (None, None, None)
    assert "locked by another process or Store object, which" in str(exc.value)


@pytest.mark.parametrize("record", [b"", b'{"pid": 12', b"[1, 2, 3]", b"{" * 5000,
                                    "stale"])
def test_a_writers_torn_garbage_or_stale_record_reads_as_unknown(path, holders, record):
    with open(logowners.lock_path(path, 0), "wb") as f:
        f.write(a_record(record))
    holders(HOLD_RAW_WRITER, f"{path}:0")
    with pytest.raises(StoreLocked) as exc:
        snapstore.repair(path)
    e = exc.value
    assert (e.lock, e.writers, e.pid, e.host, e.since) == ("writers", 1, None, None, None)
    assert "is open for writing by another process or Store object, and" in str(e)


def test_garbage_records_without_a_holder_decide_nothing(path):
    with open(lock_file(path), "wb") as f:
        f.write(os.urandom(5000))
    with open(logowners.lock_path(path, 0), "wb") as f:
        f.write(os.urandom(5000))
    with snapstore.open(path, timeout=0) as s:
        assert s._committer.log_number == 0         # adopted, its record replaced
        s.checkpoint({"x": b"3"}, "train")
        assert record_of(logowners.lock_path(path, 0))["pid"] == os.getpid()
        assert os.path.getsize(lock_file(path)) == 5000   # a writer never writes STORE/lock
    assert snapstore.repair(path)["ok"]
    assert os.path.getsize(lock_file(path)) == 0          # repair's record, cleared when done


def test_a_holder_on_another_host_is_reported_as_recorded(path, holders):
    with open(lock_file(path), "wb") as f:
        f.write(json.dumps({"pid": 4242, "host": "elsewhere", "since": "2026-01-02T03:04:05Z"})
                .encode())
    holders(HOLD_RAW_FLOCK, lock_file(path))
    with pytest.raises(StoreLocked, match="pid 4242 on host elsewhere since "
                                          "2026-01-02T03:04:05Z"):
        snapstore.open(path)


# ---- writers keep repair out -----------------------------------------------------------
def test_repair_names_the_open_writers_and_waits_for_them(path, holders):
    first = holders(HOLD_STORE, path)
    second = holders(HOLD_STORE, path)
    with pytest.raises(StoreLocked) as exc:
        snapstore.repair(path, timeout=0.2)
    e = exc.value
    assert (e.lock, e.writers, e.host) == ("writers", 2, HOST)
    # one of the writers, never the creator whose record STORE/lock once held (this process)
    assert e.pid in (first.pid, second.pid)
    assert_recent(e.since)
    assert str(e) == (f"{path} is open for writing by another process (pid {e.pid} on host "
                      f"{HOST} since {e.since}) and 1 more writer(s), and this needs the store "
                      f"to itself (waited {e.waited:.1f} s). Close its writers, or pass "
                      "timeout=SECONDS to wait for them.")
    first.release()
    threading.Timer(0.5, second.release).start()
    t0 = time.monotonic()
    report = snapstore.repair(path, timeout=30)
    assert time.monotonic() - t0 >= 0.4
    assert report["ok"] and report["checkpoints"] == 4
    assert holder_of(lock_file(path))["pid"] is None


def test_repair_names_a_writer_of_this_process(path):
    with snapstore.open(path):
        with pytest.raises(StoreLocked, match=f"open for writing by another thread or Store "
                                              f"object of this process \\(pid {os.getpid()} on host"):
            snapstore.repair(path)


def test_a_killed_writer_never_blocks_and_its_record_is_replaced(path, holders):
    holder = holders(HOLD_STORE, path)
    holder.kill()                          # its record stays in its log's lock file
    assert record_of(logowners.lock_path(path, 0))["pid"] == holder.pid
    assert logowners.live_holders(path) == []
    assert snapstore.repair(path, timeout=0)["ok"]     # no writer is open: nothing waits
    with snapstore.open(path, timeout=0) as s:         # takes the dead writer's log
        assert s._committer.log_number == 0
        assert record_of(logowners.lock_path(path, 0))["pid"] == os.getpid()
        assert [c.stream for c in s.checkpoints()] == ["train", "train", "holder"]


# ---- a running compaction keeps a second one (and verify) out ------------------------------
def test_a_compaction_waits_for_a_running_one_and_names_it(path, holders):
    holder = holders(HOLD_COMPACTING, path)
    maintenance = os.path.join(path, fmt.MAINTENANCE_LOCK_FILE)
    assert record_of(maintenance)["pid"] == holder.pid
    with snapstore.open(path, timeout=0.2) as s:
        info = s.checkpoint({"x": b"3"}, "train")       # writers are not kept out
        s.delete(1)
        for call in (s.compact, s.verify):
            with pytest.raises(StoreLocked) as exc:
                call()
            e = exc.value
            assert (e.lock, e.pid, e.host) == ("maintenance", holder.pid, HOST)
            assert e.waited >= 0.2
            assert str(e) == (f"{path}: a compaction by another process (pid {holder.pid} on "
                              f"host {HOST} since {e.since}) is running (waited "
                              f"{e.waited:.1f} s). Open the store with timeout=SECONDS to wait "
                              "for it.")
    t0 = time.monotonic()
    threading.Timer(0.5, holder.release).start()
    with snapstore.open(path, timeout=30) as s:
        report = s.compact()                        # waits for the running one to end
        assert time.monotonic() - t0 >= 0.45
        assert report["chunks_freed"] >= 1
        assert s.restore(info.id) == {"x": b"3"}
    assert os.path.getsize(maintenance) == 0          # the record is cleared when done


def test_a_compaction_kept_out_by_a_verify_names_no_one(path):
    with snapstore.open(path) as s, snapstore.open(path, readonly=True) as r:
        with r._committer.maintenance(exclusive=False):     # a verify running
            with pytest.raises(StoreLocked) as exc:
                s.compact()
        assert (exc.value.lock, exc.value.pid) == ("maintenance", None)
        assert str(exc.value).startswith(f"{path}: another compaction or a verify is running")


# ---- the command line -----------------------------------------------------------------------
# command -> (arguments, the holder that blocks it, the CLI's sentence about that holder)
WRITING = {
    "init": (["init"], HOLD_EXCLUSIVE,
             "is locked by another process (pid {pid} on host {host} since "),
    "rm": (["rm", "1"], HOLD_EXCLUSIVE,
           "is locked by another process (pid {pid} on host {host} since "),
    "tag": (["tag", "1", "t"], HOLD_EXCLUSIVE,
            "is locked by another process (pid {pid} on host {host} since "),
    "retain": (["retain", "--all-streams", "--keep-last", "1"], HOLD_EXCLUSIVE,
               "is locked by another process (pid {pid} on host {host} since "),
    "repair": (["repair"], HOLD_STORE,
               "is open for writing by another process (pid {pid} on host {host} since "),
    "compact": (["compact"], HOLD_COMPACTING,
                ": a compaction by another process (pid {pid} on host {host} since "),
}
ADVICE = {
    HOLD_EXCLUSIVE: "Wait for it with --timeout SECONDS; reading commands (ls, show, restore, "
                    "diff, verify, stats) work meanwhile.",
    HOLD_STORE: "Close its writers, or wait for them with --timeout SECONDS.",
    HOLD_COMPACTING: "Wait for it with --timeout SECONDS.",
}


@pytest.mark.parametrize("command", sorted(WRITING))
def test_every_writing_command_takes_timeout_and_names_its_holder(tmp_path, path, holders,
                                                                 command):
    args, script, sentence = WRITING[command]
    if command == "init":       # another `init` is creating this store right now
        target = str(tmp_path / "new")
        os.mkdir(target)
    else:
        target = path
    holder = holders(script, target)
    t0 = time.monotonic()
    p = snapstore_cli("-s", target, *args, "--timeout", "0.3")
    assert time.monotonic() - t0 >= 0.3
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"snapstore: error: {target}"), p.stderr
    line = lines[0]
    assert sentence.format(pid=holder.pid, host=HOST) in line
    assert "waited 0.3" in line and line.endswith(ADVICE[script])
    assert "readonly=True" not in line and "timeout=" not in line     # no Python advice
    holder.release()
    p = snapstore_cli("-s", target, *args, "--timeout", "5")
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_a_writer_process_blocks_no_writing_command_but_repair(path, holders):
    holders(HOLD_STORE, path)
    for args in (["tag", "2", "keep"], ["rm", "1"], ["compact"],
                 ["retain", "--stream", "holder", "--keep-last", "1"]):
        t0 = time.monotonic()
        p = snapstore_cli("-s", path, *args)            # --timeout 0: no waiting at all
        assert p.returncode == 0, (args, p.stdout, p.stderr)
        assert time.monotonic() - t0 < 30
    with snapstore.open(path, readonly=True) as s:
        assert [(c.id, c.tags) for c in s.checkpoints()] == [(2, ("keep",)), (3, ())]
    p = snapstore_cli("-s", path, "repair")
    assert p.returncode == 1 and "is open for writing by another process" in p.stderr


def test_timeout_may_come_before_the_command_and_waits(path, holders):
    holder = holders(HOLD_EXCLUSIVE, path)
    threading.Timer(0.5, holder.release).start()
    p = snapstore_cli("--timeout", "30", "-s", path, "rm", "latest")
    assert p.returncode == 0, p.stderr
    with snapstore.open(path, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [1]


def test_reading_commands_ignore_an_exclusive_holder(path, holders):
    holders(HOLD_EXCLUSIVE, path)                   # a repair in progress, say
    for args in (["ls"], ["show", "latest"], ["stats"], ["verify"]):
        p = snapstore_cli("-s", path, *args)
        assert p.returncode == 0, (args, p.stderr)


def test_verify_waits_for_a_running_compaction_with_timeout(path, holders):
    holder = holders(HOLD_COMPACTING, path)
    p = snapstore_cli("-s", path, "verify")
    assert p.returncode == 1
    assert f"a compaction by another process (pid {holder.pid} on host {HOST}" in p.stderr
    assert p.stderr.rstrip().endswith("Wait for it with --timeout SECONDS.")
    threading.Timer(0.5, holder.release).start()
    p = snapstore_cli("-s", path, "verify", "--timeout", "30")
    assert p.returncode == 0, p.stderr
