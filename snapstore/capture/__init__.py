"""Dirty-page capture: per-buffer change detectors (userfaultfd write-protect, fingerprint diff,
shadow copy), trackers, and the asynchronous checkpointer with its staging arena. Builds on the
engine's commit path; knows nothing of objects, integrations or tools."""
