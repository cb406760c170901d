"""Crash runner for object saves (store.save), DCP saves (SnapstoreWriter) and async torch
saves (snapstore.torch.save_async, the tensors overwritten the moment it returns): forks a
writer per trial that is SIGKILLed inside the save, at one of the store's crash points
(SNAPSTORE_CRASH_AT, reached in the save's background thread for async saves) or at a random
moment, and checks the store after each kill.

    python object_child.py objects|dcp|async STORE SEED KILLS_PER_POINT RANDOM_KILLS

After every kill (a writer open runs recovery first):
  * killed before the commit record was appended: the previous checkpoint is still the latest;
  * killed after it (the record is in the log): recovery makes the new one the latest;
  * killed at a random moment: the latest is the previous one or one the child finished;
  * the latest and the previous checkpoint load byte-exact, and verify() is ok.
Prints one JSON line per kill and a final {"done": ..., "kills": N}; exits 1 on a failed check.
Forking one runner keeps a trial cheap (no interpreter or torch start-up per kill).
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback

import numpy as np

import snapstore
from snapstore import objects

POINTS = ("after_data_append", "after_commit_append", "after_fsync", "before_index_commit",
          "after_index_commit")
BEFORE_COMMIT = ("after_data_append",)
STREAM = "obj"


def object_state(step: int, seed: int) -> dict:
    """The object saved at a step: a few arrays (C and F order) with step-dependent pages."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(1 << 17).astype(np.float32)            # 512 KiB
    b = rng.integers(0, 1 << 40, 1 << 15)                            # 256 KiB
    c = np.asfortranarray(rng.standard_normal((200, 300)))          # 480 KiB, Fortran
    r = np.random.default_rng(seed * 7919 + step)
    for arr in (a, b):
        for _ in range(4):
            i = int(r.integers(0, arr.size - 64))
            arr[i:i + 64] = step
    c[step % 200, :] = step
    extra = np.zeros(1024 * (1 + step % 3), dtype=np.uint8)          # size varies
    return {"a": a, "nested": {"b": b, "c": c, "extra": extra}, "step": step,
            "note": f"step {step}", "pb": pickle_buffer(step)}


def pickle_buffer(step: int):
    import pickle
    return pickle.PickleBuffer(bytearray(bytes([step % 256]) * 8192))


def equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            a.tobytes(order="A") == b.tobytes(order="A") and \
            a.flags.f_contiguous == b.flags.f_contiguous
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if type(a).__name__ == "PickleBuffer":
        return bytes(a.raw()) == bytes(b)
    return a == b


class Objects:
    """Object saves through store.save."""

    def __init__(self, path: str, seed: int) -> None:
        self.path, self.seed = path, seed

    def save(self, step: int) -> None:
        with snapstore.open(self.path) as store:
            store.save(object_state(step, self.seed), stream=STREAM, meta={"step": step})

    def latest_step(self, store) -> tuple[int, int]:
        info = store.latest(STREAM)
        return info.id, objects.user_meta(info)["step"]

    def check(self, store, cid: int, step: int) -> bool:
        return equal(store.load(cid), object_state(step, self.seed))

    def find(self, store, step: int) -> int:
        return next(c.id for c in reversed(store.checkpoints(STREAM))
                    if objects.user_meta(c)["step"] == step)


class Dcp:
    """torch.distributed.checkpoint saves through SnapstoreWriter."""

    def __init__(self, path: str, seed: int) -> None:
        import warnings
        warnings.filterwarnings("ignore")
        import torch
        torch.set_num_threads(1)              # no OpenMP pool before fork()
        import torch.distributed.checkpoint as dcp
        import snapstore.torch as st
        self.torch, self.dcp, self.st = torch, dcp, st
        self.path, self.seed = path, seed

    def state(self, step: int) -> dict:
        torch = self.torch
        g = torch.Generator().manual_seed(self.seed)
        state = {"layer0": torch.randn(256, 256, generator=g),
                 "layer1": torch.randn(256, 128, generator=g).to(torch.bfloat16),
                 "extra": {"step": step}}
        state["layer0"][step % 256] = float(step)
        state["layer1"][:, step % 128] = float(step)
        return state

    def save(self, step: int) -> None:
        writer = self.st.SnapstoreWriter(self.path, timeout=60)
        self.dcp.save(self.state(step), checkpoint_id=f"step-{step}", storage_writer=writer)

    def _load(self, store, checkpoint_id) -> dict:
        torch = self.torch
        target = {"layer0": torch.zeros(256, 256), "layer1": torch.zeros(256, 128,
                                                                       dtype=torch.bfloat16),
                  "extra": {"step": -1}}
        self.dcp.load(target, checkpoint_id=checkpoint_id,
                      storage_reader=self.st.SnapstoreReader(store))
        return target

    def latest_step(self, store) -> tuple[int, int]:
        info = store.latest("dcp")
        return info.id, int(info.reserved_meta["snapstore.dcp"]["checkpoint_id"].split("-")[1])

    def check(self, store, cid: int, step: int) -> bool:
        got, want = self._load(store, cid), self.state(step)
        torch = self.torch
        return got["extra"] == want["extra"] and all(
            torch.equal(got[k].view(torch.int16) if got[k].dtype == torch.bfloat16 else got[k],
                        want[k].view(torch.int16) if want[k].dtype == torch.bfloat16 else want[k])
            for k in ("layer0", "layer1"))

    def find(self, store, step: int) -> int:
        return self.st._find_dcp_checkpoint(store, "dcp", f"step-{step}").id


class TorchAsync:
    """snapstore.torch.save_async saves whose tensors training overwrites right after the call:
    whatever survives a kill must hold the values as of the call."""

    STREAM = "async"

    def __init__(self, path: str, seed: int) -> None:
        import torch
        torch.set_num_threads(1)              # no OpenMP pool before fork()
        import snapstore.torch as st
        self.torch, self.st = torch, st
        self.path, self.seed = path, seed

    def state(self, step: int) -> dict:
        torch = self.torch
        g = torch.Generator().manual_seed(self.seed)
        state = {"w": torch.randn(384, 256, generator=g),                      # 384 KiB
                 "h": torch.randn(256, 256, generator=g).to(torch.bfloat16),
                 "step": step}
        state["w"][step % 384] = float(step)
        state["h"][:, step % 256] = float(step)
        return state

    def save(self, step: int) -> None:
        with snapstore.open(self.path) as store:
            state = self.state(step)
            future = self.st.save_async(store, state, self.STREAM, meta={"step": step})
            for k in ("w", "h"):              # training moves on before the save is durable
                state[k].mul_(-3).add_(1)
            future.result(timeout=60)

    def latest_step(self, store) -> tuple[int, int]:
        info = store.latest(self.STREAM)
        return info.id, objects.user_meta(info)["step"]

    def check(self, store, cid: int, step: int) -> bool:
        got, want = self.st.load(store, cid), self.state(step)
        torch = self.torch
        return got["step"] == step and torch.equal(got["w"], want["w"]) and torch.equal(
            got["h"].view(torch.int16), want["h"].view(torch.int16))

    def find(self, store, step: int) -> int:
        return next(c.id for c in reversed(store.checkpoints(self.STREAM))
                    if objects.user_meta(c)["step"] == step)


def child(kind, path: str, step: int, crash_at: str | None) -> None:
    """The forked writer: never returns."""
    try:
        if crash_at:
            os.environ["SNAPSTORE_CRASH_AT"] = crash_at
        if crash_at:
            kind.save(step)
            os._exit(3)                                       # the crash point never hit
        while True:                                           # random moment: save and save
            kind.save(step)
            step += 1
    except BaseException:
        traceback.print_exc()
        os._exit(4)


def main() -> int:
    mode, path, seed, per_point, n_random = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4]), int(sys.argv[5])
    kind = {"objects": Objects, "dcp": Dcp, "async": TorchAsync}[mode](path, seed)
    rng = random.Random(seed)
    kind.save(0)
    acked, next_step, kills = 0, 1, 0
    trials = [p for p in POINTS for _ in range(per_point)] + ["random"] * n_random
    rng.shuffle(trials)
    for trial in trials:
        step = next_step
        next_step += 1000 if trial == "random" else 1
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(kind, path, step, None if trial == "random" else trial)
        if trial == "random":
            time.sleep(rng.uniform(0.01, 0.12 if mode == "objects" else 0.4))
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            print(json.dumps({"error": f"{trial}: writer ended with status {status}"}))
            return 1
        kills += 1
        with snapstore.open(path) as store:                   # a writer open: recovery
            cid, latest = kind.latest_step(store)
            if trial in BEFORE_COMMIT:
                ok = latest == acked
            elif trial in POINTS:
                ok = latest == step
            else:
                ok = latest == acked or step <= latest < next_step
            problems = []
            if not ok:
                problems.append(f"latest step {latest} after a kill at {trial} (previous "
                                f"{acked}, in flight {step})")
            if not kind.check(store, cid, latest):
                problems.append(f"latest checkpoint {cid} (step {latest}) does not load exactly")
            prev = kind.find(store, acked)
            if not kind.check(store, prev, acked):
                problems.append(f"previous checkpoint {prev} (step {acked}) does not load exactly")
            report = store.verify()
            if not report["ok"]:
                problems.append(f"verify: {report['problems'][:3]}")
        print(json.dumps({"kill": kills, "trial": trial, "step": step, "latest": latest,
                          "problems": problems}))
        if problems:
            return 1
        acked = latest
    print(json.dumps({"done": mode, "kills": kills}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
