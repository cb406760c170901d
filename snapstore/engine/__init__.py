"""The storage engine: the on-disk format, the write-ahead log of segments and its backends,
the LMDB index, the commit path, the read path, recovery and maintenance (compaction,
verification). Nothing here imports the capture, object, integration or tool layers.
See docs/design.md."""
