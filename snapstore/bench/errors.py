"""The one error of the bench harness."""


class BenchError(Exception):
    """A benchmark cannot run as asked (bad workload, unknown method, a baseline tool failed,
    missing plotting library...)."""
