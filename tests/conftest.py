"""Shared pytest set-up: hypothesis profiles, and tests/ on sys.path so `import reference` works.

SNAPSTORE_HYPOTHESIS_PROFILE=slow raises example counts tenfold (default profile: "dev").
Property tests scale their own counts with settings.default.max_examples / 100.
"""
import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, **_common)
settings.register_profile("slow", max_examples=1000, **_common)
settings.load_profile(os.environ.get("SNAPSTORE_HYPOTHESIS_PROFILE", "dev"))
