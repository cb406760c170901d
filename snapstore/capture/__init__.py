"""Dirty-page capture: per-buffer change detectors (dirty.py: userfaultfd write-protect,
fingerprint diff, shadow copy), captures (tracker.py: Tracker and checkpoint_async's implicit
capturer), the asynchronous persister (persister.py) and its staging arena (staging.py).
Builds on the engine's commit path (engine/commit.py); knows nothing of the Store, objects,
integrations or tools."""
