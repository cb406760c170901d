"""Resolution cost over a store of N checkpoints (issue 15 names).

    python3 benchmarks/bench_names.py [N]      (default 10000)
"""
import os
import sys
import tempfile
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import snapstore  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
d = os.path.join(tempfile.mkdtemp(), "s")
s = snapstore.open(d, durability="none")
t = time.perf_counter()
for i in range(N):
    s.checkpoint({"a": b"x" * 64, "b": b"y" * 64, "c": b"z" * 64}, f"s{i % 10}",
                 meta={"step": i, "snapstore.dcp": {"checkpoint_id": f"step-{i}"}})
s.tag(N // 2, "best")
print(f"built {N} checkpoints in {time.perf_counter() - t:.1f}s")
for name in [N // 2, "latest", "latest:s3", f"s3@{N // 20}", "s3", "best", "tag:best",
             f"dcp:step-{N - 7}", f"step-{N - 7}"]:
    n = 20 if isinstance(name, int) or name.startswith("latest") or "@" in name else 3
    sec = timeit.timeit(lambda: s.resolve(name), number=n) / n
    print(f"resolve({name!r:>16}): {sec * 1e3:9.3f} ms")
