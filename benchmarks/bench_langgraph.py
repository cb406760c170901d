"""SnapstoreSaver vs langgraph-checkpoint-sqlite's SqliteSaver on one agent-like thread.

Workload (issue 9), identical for every saver (seeded): one thread of --steps (500) puts.
The state has three channels: "messages", a list that grows by one ~2 KiB chat message per step
(langchain_core messages, as LangGraph's add_messages keeps them); "arr", a 1 MiB float64 NumPy
array of which 1% of the elements get new random values per step (in runs of 64 elements =
512 bytes at random places, so ~20 of its 256 pages change); "step", a small int. Every
channel changes at every step, so each put carries all three in new_versions, as a LangGraph
loop would. Puts are driven directly (no graph around them) and timed one by one.

Savers: SnapstoreSaver with durability "fsync" (every put durable before it returns) and
"none" (the OS decides when), both opened by from_path (so with sync_index=False: one sync per
durable put; --turns also runs sync_index=True, every index transaction synced), and SqliteSaver with its defaults (WAL journal, Python's default
synchronous=FULL: the WAL is fsynced at every commit). Disk size is what the files occupy
(allocated blocks) after the saver is closed, so SQLite's WAL has been checkpointed.

    python3 benchmarks/bench_langgraph.py [--steps 500] [--dir /path/on/real/disk]
    python3 benchmarks/bench_langgraph.py --turns 200     # message-only agent turns (issue 18)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from snapstore.langgraph import SnapstoreSaver  # noqa: E402

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402

ARRAY_BYTES = 1 << 20
MESSAGE_BYTES = 2048
RUN = 64                     # elements per changed run


def words(rng: np.random.Generator, n_bytes: int) -> str:
    vocab = ["state", "agent", "tool", "result", "the", "of", "checkpoint", "value", "and",
             "graph", "node", "message", "returns", "a", "list", "with", "call", "error",
             "retry", "user", "asks", "for", "weather", "in", "Paris", "answer", "is", "42"]
    out = []
    size = 0
    while size < n_bytes:
        w = vocab[int(rng.integers(len(vocab)))]
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_bytes]


def workload(steps: int, seed: int):
    """Yields (step, channel_values) per step; every channel changes; arr mutates in place."""
    rng = np.random.default_rng(seed)
    arr = rng.random(ARRAY_BYTES // 8)
    messages: list = []
    n_runs = max(1, int(arr.size * 0.01) // RUN)
    for step in range(steps):
        cls = HumanMessage if step % 2 == 0 else AIMessage
        messages = messages + [cls(content=words(rng, MESSAGE_BYTES), id=f"m{step}")]
        if step:
            for start in rng.integers(0, arr.size - RUN, n_runs):
                arr[start:start + RUN] = rng.random(RUN)
        yield step, {"messages": messages, "arr": arr, "step": step}


def drive(saver, steps: int, seed: int) -> list[float]:
    """Puts the workload into saver; returns the seconds of each put."""
    times = []
    config = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    versions: dict = {}
    for step, values in workload(steps, seed):
        new = {ch: saver.get_next_version(versions.get(ch), None) for ch in values}
        versions.update(new)
        checkpoint = {"v": 4, "id": str(uuid6(clock_seq=step)),
                      "ts": datetime.now(timezone.utc).isoformat(),
                      "channel_values": values, "channel_versions": dict(versions),
                      "versions_seen": {"agent": dict(versions)},
                      "updated_channels": sorted(new)}
        metadata = {"source": "loop", "step": step, "parents": {}}
        t = time.perf_counter()
        config = saver.put(config, checkpoint, metadata, new)
        times.append(time.perf_counter() - t)
    return times


def disk_bytes(path: str) -> tuple[int, int]:
    """(allocated bytes, apparent bytes) of a file or directory tree."""
    paths = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    alloc = apparent = 0
    for p in paths:
        st = os.stat(p)
        alloc += st.st_blocks * 512
        apparent += st.st_size
    return alloc, apparent


def check_latest(saver, seed: int, steps: int) -> float:
    """Seconds of get_tuple(latest); checks it equals the last state of the workload."""
    *_, (_, last) = workload(steps, seed)
    t = time.perf_counter()
    tup = saver.get_tuple({"configurable": {"thread_id": "bench", "checkpoint_ns": ""}})
    dt = time.perf_counter() - t
    got = tup.checkpoint["channel_values"]
    assert np.array_equal(got["arr"], last["arr"]), "arr differs"
    assert [m.content for m in got["messages"]] == [m.content for m in last["messages"]]
    assert got["step"] == last["step"]
    return dt


def run_snapstore(root: str, durability: str, steps: int, seed: int) -> dict:
    path = os.path.join(root, f"snapstore-{durability}")
    with SnapstoreSaver.from_path(path, durability=durability) as saver:
        times = drive(saver, steps, seed)
        read = check_latest(saver, seed, steps)
    return {"name": f"SnapstoreSaver (durability={durability})", "times": times, "read": read,
            "disk": disk_bytes(path)}


def run_sqlite(root: str, steps: int, seed: int) -> dict:
    from langgraph.checkpoint.sqlite import SqliteSaver
    path = os.path.join(root, "sqlite.db")
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        sync = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
        journal = saver.conn.execute("PRAGMA journal_mode").fetchone()[0]
        times = drive(saver, steps, seed)
        read = check_latest(saver, seed, steps)
    alloc = apparent = 0
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            a, b = disk_bytes(path + suffix)
            alloc += a
            apparent += b
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return {"name": f"SqliteSaver (journal={journal}, synchronous={names.get(sync, sync)})",
            "times": times, "read": read, "disk": (alloc, apparent)}


# ---- message-only agent turns (issue 18) ----------------------------------------------------
def _turn_graph(saver):
    """A compiled graph of MessagesState: agent -> tools -> final, each adding one message, so
    a turn (one invoke with a user message) makes 5 checkpoints and 3 put_writes."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    def node(kind: str, words_: str):
        def run(state):
            n = len(state["messages"])
            return {"messages": [AIMessage(content=(words_ + " ") * 30 + str(n),
                                           id=f"{kind}{n}")]}
        return run
    g = StateGraph(MessagesState)
    for kind, text in (("agent", "thinking"), ("tools", "tool result"), ("final", "answer")):
        g.add_node(kind, node(kind, text))
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("tools", "final")
    g.add_edge("final", END)
    return g.compile(checkpointer=saver)


def drive_turns(saver, turns: int) -> dict:
    """Seconds per turn, per put and per put_writes (timed inside the graph's calls), and of
    list(limit=5) after the last turn (best of 5)."""
    timed: dict = {"put": [], "put_writes": []}
    for name in timed:
        real = getattr(saver, name)

        def wrapped(*a, _real=real, _out=timed[name], **k):
            t = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                _out.append(time.perf_counter() - t)
        setattr(saver, name, wrapped)
    graph = _turn_graph(saver)
    config = {"configurable": {"thread_id": "t1"}}
    turn_times = []
    for i in range(turns):
        t = time.perf_counter()
        graph.invoke({"messages": [HumanMessage(content=("question " * 30) + str(i),
                                                id=f"h{i}")]}, config)
        turn_times.append(time.perf_counter() - t)
    lists = []
    for _ in range(5):
        t = time.perf_counter()
        assert len(list(saver.list(config, limit=5))) == 5
        lists.append(time.perf_counter() - t)
    return {"turn": turn_times, "put": timed["put"], "put_writes": timed["put_writes"],
            "list": min(lists)}


def run_turns(root: str, turns: int) -> list:
    from langgraph.checkpoint.sqlite import SqliteSaver
    out = []
    # from_path's default (sync_index=False: one sync per put), then every index transaction
    # synced too (three per put)
    for sync_index in (False, True):
        path = os.path.join(root, f"turns-snapstore-{sync_index}")
        with SnapstoreSaver.from_path(path, durability="fsync", sync_index=sync_index) as saver:
            r = drive_turns(saver, turns)
        r.update(name=f"SnapstoreSaver (fsync, sync_index={sync_index})",
                 disk=disk_bytes(path)[0], index=disk_bytes(os.path.join(path, "index"))[0],
                 data=disk_bytes(os.path.join(path, "segments"))[0])
        out.append(r)
    path = os.path.join(root, "turns.db")
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        r = drive_turns(saver, turns)
    r.update(name="SqliteSaver", disk=sum(disk_bytes(path + x)[0] for x in ("", "-wal", "-shm")
                                          if os.path.exists(path + x)))
    out.append(r)
    return out


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    ap.add_argument("--turns", type=int, default=0,
                    help="instead: N message-only agent turns of a real graph (5 checkpoints "
                         "per turn), per-turn/put/put_writes/list(limit=5) times and disk")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-langgraph-", dir=args.dir)
    try:
        if args.turns:
            return print_turns(run_turns(root, args.turns), args.turns)
        results = [run_snapstore(root, "fsync", args.steps, args.seed),
                   run_snapstore(root, "none", args.steps, args.seed),
                   run_sqlite(root, args.steps, args.seed)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    from importlib.metadata import version
    print(f"{args.steps} puts of one thread; state: messages +1 x {MESSAGE_BYTES} B/step "
          f"(final {args.steps} messages), 1 MiB float64 array with 1% of elements changed per "
          f"step, a step counter. sqlite3 {sqlite3.sqlite_version}, langgraph-checkpoint "
          f"{version('langgraph-checkpoint')}, langgraph-checkpoint-sqlite "
          f"{version('langgraph-checkpoint-sqlite')}.\n")
    base = results[-1]
    print("| saver | disk (allocated) | vs SQLite | put mean | put median | put p95 | "
          "put vs SQLite (mean) | get_tuple(latest) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["times"]
        mean = statistics.fmean(t)
        p95 = sorted(t)[int(0.95 * (len(t) - 1))]
        print(f"| {r['name']} | {mib(r['disk'][0])} | {base['disk'][0] / r['disk'][0]:.1f}x "
              f"smaller | {mean * 1e3:.2f} ms | {statistics.median(t) * 1e3:.2f} ms | "
              f"{p95 * 1e3:.2f} ms | {mean / statistics.fmean(base['times']):.2f}x | "
              f"{r['read'] * 1e3:.1f} ms |")


def print_turns(results: list, turns: int) -> None:
    print(f"{turns} turns of a message-only graph (agent -> tools -> final; 5 checkpoints a "
          "turn), one thread, durability fsync / SQLite's defaults\n")
    print("| saver | per turn (median) | put (median) | put_writes (median) | list(limit=5) | "
          "disk |")
    print("|---|---|---|---|---|---|")
    for r in results:
        disk = mib(r["disk"])
        if "index" in r:
            disk += f" (index {mib(r['index'])}, data {mib(r['data'])})"
        print(f"| {r['name']} | {statistics.median(r['turn']) * 1e3:.1f} ms | "
              f"{statistics.median(r['put']) * 1e3:.2f} ms | "
              f"{statistics.median(r['put_writes']) * 1e3:.2f} ms | {r['list'] * 1e3:.1f} ms | "
              f"{disk} |")


if __name__ == "__main__":
    main()
