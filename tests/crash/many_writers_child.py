"""The processes of the many-writers kill torture (test_many_writers_kill.py), and the content
both sides share.

Every role is a function role_<name>(args: dict) -> exit code, run in a process of its own:

    writer       one stream of its own ("w<i>"): checkpoints (some with expect_head), deletes
                 (some of two checkpoints at once: delete_many), tags and untags
    coordinator  group commits of stream "grp" with participants p0, p1, p2: opens a group,
                 publishes its id in the file args["group_file"], waits until every part is
                 staged and commits (or lets it run into GroupTimeout); deletes old group
                 checkpoints
    participant  stages its part of each group the coordinator publishes: one buffer whose
                 bytes are part_content(seed, participant, offset), meta {"offset", "base",
                 "sha"} (base: its offset in the group's parent)
    compactor    compact() in a loop (sometimes forcing the index shrink)
    reader       read-only: lists, restores and reads ranges, checking every byte against the
                 SHA-256 the checkpoint's meta records; now and then verify()

Writers and the coordinator journal what they do, one os.write of a whole line per event on an
O_APPEND descriptor (a kill never tears a line):

    ready                        the store is open (recovery done)
    try <key>                    checkpoint with digest <key> about to start
    ok <id> <key>                checkpoint() returned <id> (journal fsynced)
    try-del <id>[,<id>]          delete / delete_many about to start
    del <id>[,<id>]              it returned (fsynced)
    try-tag <id> <tag> <0|1>     untag (0) / tag (1) about to start
    tag <id> <tag> <0|1>         it returned (fsynced)
    gtry <gid>                   group.commit() of group <gid> about to start
    gok <id> <gid>               it returned checkpoint <id> (fsynced)
    gtimeout <gid>               it raised GroupTimeout (nothing may be visible)
    stop                         asked to stop (args["stop_file"] exists): closed cleanly

A checkpoint's key: digest(meta["sha"]) for a writer's checkpoint, "g:<gid>" for a group's.
Readers write "seen <id> <key>" for every checkpoint they restored and checked, and exit 3
(message on stderr) at the first wrong byte or unexpected error. SNAPSTORE_CRASH_AT in the
role's environment makes the store SIGKILL it at an injected point.

    python many_writers_child.py zygote
        The parent's process factory: imports snapstore once, then forks a process per
        command read from stdin ("spawn <json {role, args, env, log}>" answers "pid <pid>";
        "kill <pid>" SIGKILLs a child it has not reaped yet) and reports every child's end
        ("exit <pid> <code>", code -9 for SIGKILL); "dump <pid>" makes a child write its
        threads' stacks to its log (faulthandler, SIGUSR1). On EOF it SIGKILLs what is left and
        exits. Forking a prepared process makes a child start in milliseconds, not in the
        ~0.2 s an interpreter and the imports take.

    python many_writers_child.py run ROLE JSON_ARGS
        One role in this process (to reproduce by hand).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import snapstore  # noqa: E402
from snapstore.errors import (CheckpointNotFound, ConcurrentCompactionError,  # noqa: E402
                              GroupError, GroupTimeout, StoreLocked)

PAGE = 4096
SEGMENT_SIZE = 64 << 10          # the smallest allowed: every log rolls over every few commits
GROUP_STREAM = "grp"
PARTICIPANTS = ("p0", "p1", "p2")
PART_PAGES = {"p0": 8, "p1": 14, "p2": 20}          # 32, 56 and 80 KiB
WRITER_SIZES = (24 << 10, 40 << 10 | 123, 64 << 10, 100 << 10 | 7, 160 << 10)
MAX_LIVE = 6                     # a writer keeps at most this many checkpoints of its stream
GROUP_KEEP = 4                   # the coordinator keeps this many group checkpoints
GROUP_TIMEOUT = 0.5              # seconds a group may take


# ---- content ------------------------------------------------------------------------------
def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(shas: dict) -> str:
    """A checkpoint's key: one hash over its buffers' names and SHA-256s."""
    h = hashlib.sha256()
    for name in sorted(shas):
        h.update(name.encode() + b"\0" + shas[name].encode() + b"\0")
    return h.hexdigest()[:32]


def part_content(seed: int, participant: str, offset: int) -> bytes:
    """A participant's state at source offset `offset`: page j is redrawn every 4000 offsets
    (shifted per page), so consecutive parts share most pages and stage as page deltas."""
    out = bytearray()
    for j in range(PART_PAGES[participant]):
        epoch = (offset + j * 977) // 4000
        out += random.Random(f"{seed}:{participant}:{j}:{epoch}").randbytes(PAGE)
    return bytes(out)


def part_step(gid: str, participant: str) -> int:
    """How far a participant's offset advances in group gid."""
    return 1 + int(hashlib.sha256(f"{gid}:{participant}".encode()).hexdigest()[:8], 16) % 3000


def key_of(info, got: dict | None = None) -> str:
    """The key of a listed checkpoint (from its meta; never from its bytes)."""
    if info.stream == GROUP_STREAM:
        return "g:" + str(info.reserved_meta.get("snapstore.group", {}).get("id"))
    return digest(info.meta["sha"])


def check_restored(seed: int, info, got: dict, full: bool = False) -> str | None:
    """What is wrong with a restored checkpoint (None: nothing). Writer checkpoints are
    checked against the SHA-256s of their meta; group checkpoints must hold every
    participant's part, consistent with its offsets (full=True regenerates the bytes)."""
    if info.stream == GROUP_STREAM:
        parts = snapstore.group_parts(info)
        if set(parts) != set(PARTICIPANTS):
            return f"group checkpoint {info.id} has parts {sorted(parts)}"
        want = {f"{p}/state" for p in PARTICIPANTS}
        if set(got) != want:
            return f"group checkpoint {info.id} has buffers {sorted(got)}, not {sorted(want)}"
        for p, meta in parts.items():
            data = got[f"{p}/state"]
            if not isinstance(meta, dict) or not meta.get("offset", 0) > meta.get("base", -1):
                return f"group checkpoint {info.id}: part {p} meta {meta}"
            if sha(data) != meta["sha"]:
                return (f"group checkpoint {info.id}: part {p} (offset {meta['offset']}) "
                        f"restored wrong bytes ({len(data)} bytes)")
            if full and data != part_content(seed, p, meta["offset"]):
                return (f"group checkpoint {info.id}: part {p} is not its content at offset "
                        f"{meta['offset']}")
        return None
    if not info.stream.startswith("w"):
        return f"checkpoint {info.id} of unknown stream {info.stream!r}"
    shas = info.meta.get("sha") if isinstance(info.meta, dict) else None
    if not isinstance(shas, dict) or set(shas) != set(got):
        return f"checkpoint {info.id}: buffers {sorted(got)} vs meta {info.meta}"
    for name, data in got.items():
        if sha(data) != shas[name]:
            return (f"checkpoint {info.id} of stream {info.stream}: buffer {name!r} restored "
                    f"wrong bytes ({len(data)} bytes)")
    if info.sizes != {n: len(v) for n, v in got.items()}:
        return f"checkpoint {info.id}: sizes {info.sizes}"
    return None


# ---- plumbing -------------------------------------------------------------------------------
class Journal:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(self, line: str, sync: bool = False) -> None:
        os.write(self.fd, (line + "\n").encode())
        if sync:
            os.fsync(self.fd)


class Failed(Exception):
    """A role saw something wrong: it exits 3 with the message."""


def _stopped(args: dict) -> bool:
    return os.path.exists(args["stop_file"])


def _retry(what, attempts: int = 50):
    """what() retried on ConcurrentCompactionError (a compaction moved what it read)."""
    for _ in range(attempts - 1):
        try:
            return what()
        except ConcurrentCompactionError:
            time.sleep(0.001)
    return what()


def _open(args: dict, **kw):
    return snapstore.open(args["path"], segment_size=SEGMENT_SIZE, **kw)


# ---- roles ----------------------------------------------------------------------------------
def role_writer(args: dict) -> int:
    seed, w = args["seed"], args["index"]
    rng = random.Random(f"{seed}:{args['round']}:w{w}")
    stream = f"w{w}"
    j = Journal(args["journal"])
    store = _open(args, max_chain=rng.choice((2, 3, 4)),
                  chunk_size=rng.choice((16384, 65536)))
    latest = store.latest(stream)
    if latest is not None:          # resume from the stream's state
        state = bytearray(_retry(lambda: store.restore(latest.id))["state"])
    else:
        state = bytearray(rng.randbytes(rng.choice(WRITER_SIZES)))
    j.note(f"ready {time.time():.3f}")
    while not _stopped(args):
        roll = rng.random()
        live = [c.id for c in store.checkpoints(stream)]
        if len(live) > MAX_LIVE or (roll < 0.15 and len(live) >= 3):
            victims = [live[0]] if len(live) > MAX_LIVE else [rng.choice(live)]
            if rng.random() < 0.3:
                victims.append(rng.choice([i for i in live if i not in victims]))
            names = ",".join(map(str, victims))
            j.note(f"try-del {names}")
            if len(victims) == 1 and rng.random() < 0.5:
                store.delete(victims[0])
            else:
                store.delete_many(victims)
            j.note(f"del {names}", sync=True)
            continue
        if roll < 0.27 and live:
            cid = rng.choice(live)
            tag = f"{stream}t{rng.randrange(3)}"
            add = rng.random() < 0.6
            j.note(f"try-tag {cid} {tag} {int(add)}")
            if add:
                store.tag(cid, tag)
            else:
                store.untag(cid, tag)
            j.note(f"tag {cid} {tag} {int(add)}", sync=True)
            continue
        # mutate, then checkpoint
        if rng.random() < 0.05:
            state = bytearray(rng.randbytes(rng.choice(WRITER_SIZES)))
        elif rng.random() < 0.1:
            start = rng.randrange(len(state))
            state[start:] = rng.randbytes(len(state) - start)
        else:
            for _ in range(rng.randint(0, 6)):
                off = rng.randrange(len(state))
                n = min(rng.randint(1, PAGE), len(state) - off)
                state[off:off + n] = rng.randbytes(n)
        bufs = {"state": bytes(state), "small": rng.randbytes(rng.randint(0, 2000))}
        if rng.random() < 0.2:
            bufs["empty"] = b""
        shas = {n: sha(v) for n, v in bufs.items()}
        key = digest(shas)
        kw = {}
        if rng.random() < 0.3:
            head = store.latest(stream)
            kw["expect_head"] = head.id if head is not None else None
        j.note(f"try {key}")
        info = store.checkpoint(bufs, stream=stream, meta={"w": w, "sha": shas}, **kw)
        j.note(f"ok {info.id} {key}", sync=True)
    store.close()
    j.note("stop", sync=True)
    return 0


def _write_group_file(path: str, d: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(d, f)
    os.rename(tmp, path)


def role_coordinator(args: dict) -> int:
    rng = random.Random(f"{args['seed']}:{args['round']}:coordinator")
    j = Journal(args["journal"])
    store = _open(args)
    j.note(f"ready {time.time():.3f}")
    while not _stopped(args):
        ids = [c.id for c in store.checkpoints(GROUP_STREAM)]
        if len(ids) > GROUP_KEEP:
            old = ids[:len(ids) - GROUP_KEEP]       # never the head: a group builds on it
            names = ",".join(map(str, old))
            j.note(f"try-del {names}")
            store.delete_many(old)
            j.note(f"del {names}", sync=True)
        opened = time.time()
        group = store.group(GROUP_STREAM, list(PARTICIPANTS), timeout=GROUP_TIMEOUT)
        _write_group_file(args["group_file"], {"gid": group.id, "parent": group.parent})
        while not _stopped(args) and time.time() < opened + GROUP_TIMEOUT:
            try:
                if not group.status()["missing"]:
                    break
            except GroupError as exc:
                if time.time() < opened + GROUP_TIMEOUT:
                    raise Failed(f"group {group.id} vanished before its deadline: {exc}")
                break
            time.sleep(0.003)
        if _stopped(args):
            if rng.random() < 0.5:
                group.abort()
            break                   # (close() drops the group otherwise)
        j.note(f"gtry {group.id}")
        try:
            info = group.commit(meta={"parent": group.parent})
        except GroupError as exc:   # GroupTimeout, or the group's deadline passed
            if time.time() < opened + GROUP_TIMEOUT and not isinstance(exc, GroupTimeout):
                raise Failed(f"group {group.id} failed before its deadline: {exc!r}")
            j.note(f"gtimeout {group.id}", sync=True)
            continue
        j.note(f"gok {info.id} {group.id}", sync=True)
    store.close()
    j.note("stop", sync=True)
    return 0


def role_participant(args: dict) -> int:
    seed, p = args["seed"], args["participant"]
    j = Journal(args["journal"])
    store = _open(args)
    j.note(f"ready {time.time():.3f}")
    done = None
    missing_since = None
    while not _stopped(args):
        try:
            with open(args["group_file"]) as f:
                g = json.load(f)
        except FileNotFoundError:
            g = None
        if g is None or g["gid"] == done:
            time.sleep(0.002)
            continue
        base = 0
        if g["parent"] is not None:
            try:
                parent = store.get(g["parent"])
            except CheckpointNotFound:
                # The group's parent, which the coordinator committed, is not visible here
                # (yet): should never happen since an Index looks for a replaced index at
                # every transaction; noted (the parent checks it), then retried.
                if missing_since is None:
                    missing_since = time.monotonic()
                time.sleep(0.002)
                continue
            base = snapstore.group_parts(parent)[p]["offset"]
            if missing_since is not None:
                j.note(f"parent-late {g['gid']} {time.monotonic() - missing_since:.3f}")
        missing_since = None
        done = g["gid"]
        offset = base + part_step(g["gid"], p)
        data = part_content(seed, p, offset)
        try:
            store.stage(g["gid"], p, {f"{p}/state": data},
                        meta={"offset": offset, "base": base, "sha": sha(data)})
        except GroupError as exc:           # timed out, aborted, or an old group file
            j.note(f"stage-failed {g['gid']} {type(exc).__name__}")
            continue
        j.note(f"staged {g['gid']} {offset}")
    store.close()
    j.note("stop", sync=True)
    return 0


def role_compactor(args: dict) -> int:
    rng = random.Random(f"{args['seed']}:{args['round']}:compactor")
    j = Journal(args["journal"])
    store = _open(args, max_chain=3)
    j.note(f"ready {time.time():.3f}")
    while not _stopped(args):
        shrink = rng.choice((None, None, True, False))
        try:
            rep = store.compact(threshold=rng.choice((0.5, 0.5, 0.9)), shrink_index=shrink)
        except StoreLocked:         # a writer's open removing index swap leftovers
            j.note("locked")
            time.sleep(0.005)
            continue
        j.note("compact " + json.dumps({k: rep[k] for k in (
            "segments_removed", "chunks_freed", "chunks_trimmed", "chains_folded",
            "index_shrunk")}))
        time.sleep(rng.uniform(0, 0.02))
    store.close()
    j.note("stop", sync=True)
    return 0


def role_reader(args: dict) -> int:
    seed = args["seed"]
    rng = random.Random(f"{seed}:{args['round']}:reader{args['index']}")
    j = Journal(args["journal"])
    checked: set = set()
    retries = 0
    first = True
    while not _stopped(args):
        store = snapstore.open(args["path"], readonly=True, timeout=10)
        if first:
            j.note(f"ready {time.time():.3f}")
            first = False
        try:
            for _ in range(rng.randint(1, 30)):
                if _stopped(args):
                    break
                infos = store.checkpoints()
                if not infos:
                    time.sleep(0.005)
                    continue
                fresh = [c for c in infos if c.id not in checked]
                info = rng.choice(fresh or infos)
                try:
                    got = store.restore(info.id)
                    problem = check_restored(seed, info, got)
                    if problem is None and rng.random() < 0.3:
                        name = rng.choice(sorted(got))
                        off = rng.randint(0, len(got[name]))
                        n = rng.randint(0, len(got[name]) - off)
                        if store.read(info.id, name, off, n) != got[name][off:off + n]:
                            problem = (f"checkpoint {info.id}: read({name!r}, {off}, {n}) "
                                       "differs from its restore")
                except ConcurrentCompactionError:
                    retries += 1
                    continue
                except CheckpointNotFound:
                    continue            # deleted since the listing
                if problem is not None:
                    raise Failed(problem)
                if info.id not in checked:
                    checked.add(info.id)
                    j.note(f"seen {info.id} {key_of(info)}")
            if args.get("verify") and rng.random() < 0.2:
                try:
                    rep = store.verify(deep=rng.random() < 0.5)
                except StoreLocked:     # a compaction took longer than the timeout
                    j.note("verify-locked")
                    continue
                if not rep["ok"]:
                    raise Failed(f"verify() while others write: {rep['problems'][:3]}")
                j.note("verified")
        finally:
            store.close()
    j.note(f"retries {retries}")
    j.note("stop", sync=True)
    return 0


ROLES = {"writer": role_writer, "coordinator": role_coordinator,
         "participant": role_participant, "compactor": role_compactor,
         "reader": role_reader}


def run_role(role: str, args: dict) -> int:
    try:
        return ROLES[role](args)
    except Failed as exc:
        sys.stderr.write(f"{role} FAILED: {exc}\n")
        return 3
    except BaseException:
        traceback.print_exc()
        return 1


# ---- the zygote -------------------------------------------------------------------------------
def _child(spec: dict) -> None:
    """In a forked child: stdio to the log, the environment, the role; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        import faulthandler
        faulthandler.register(signal.SIGUSR1, all_threads=True)    # "dump": where it hangs
        os.environ.pop("SNAPSTORE_CRASH_AT", None)
        os.environ.update(spec.get("env", {}))
        random.seed()
        code = run_role(spec["role"], spec["args"])
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


def zygote() -> int:
    out = sys.stdout
    live: set = set()
    pending = b""
    out.write("ready\n")
    out.flush()
    eof = False
    while not eof or live:
        if eof:                 # the parent is gone: nobody will collect them
            for pid in live:
                os.kill(pid, signal.SIGKILL)
        ready, _, _ = select.select([] if eof else [0], [], [], 0.003)
        if ready:
            data = os.read(0, 65536)
            if not data:
                eof = True
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                word, _, rest = line.decode().partition(" ")
                if word == "spawn":
                    spec = json.loads(rest)
                    pid = os.fork()
                    if pid == 0:
                        _child(spec)
                    live.add(pid)
                    out.write(f"pid {pid}\n")
                elif word in ("kill", "dump"):
                    pid = int(rest)
                    if pid in live:     # not reaped yet: the pid is still this child's
                        os.kill(pid, signal.SIGKILL if word == "kill" else signal.SIGUSR1)
                out.flush()
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            live.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if not eof:
                out.write(f"exit {pid} {code}\n")
                out.flush()
    return 0


def main(argv: list) -> int:
    if argv[1] == "zygote":
        return zygote()
    if argv[1] == "run":
        return run_role(argv[2], json.loads(argv[3]))
    raise SystemExit(f"unknown mode {argv[1]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
