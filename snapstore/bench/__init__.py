"""The checkpoint-overhead benchmark harness behind `snapstore bench`, usable as a library:

    from snapstore import bench
    result = bench.run([bench.Workload(size=64 << 20, dirty=0.01)])
    print(bench.format_table(result))
"""
from snapstore.bench.harness import (BenchError, Workload, available_methods, format_table,
                                     plot, run, run_workload, to_json)

__all__ = ["BenchError", "Workload", "available_methods", "format_table", "plot", "run",
           "run_workload", "to_json"]
