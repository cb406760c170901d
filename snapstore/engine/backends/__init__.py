"""Storage backends of the write-ahead log: the contract (base) and its implementations.

    base   SegmentBackend, SegmentFile, SegmentReader: the abstract contract the engine uses
    local  LocalSegments: segments as files in one directory
"""
from snapstore.engine.backends.base import (SegmentBackend, SegmentFile, SegmentReader,
                                            missing_segment, not_a_segment, segment_name,
                                            segment_number)
from snapstore.engine.backends.local import LocalSegments

__all__ = ["SegmentBackend", "SegmentFile", "SegmentReader", "LocalSegments",
           "missing_segment", "not_a_segment", "segment_name", "segment_number"]
