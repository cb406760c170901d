"""S3 stores: a store kept in an object store bucket (docs/design.md, "S3 stores").

Modules: layout (keys, URLs and the remote format's constants), s3client (the only module
that talks to S3), checkpoints (checkpoint objects), envelope (the framing
of checked objects), refs (stream refs), segments (the
segment backend: own segments uploaded, others read by range through a block cache), sync
(pulling the bucket's state into the local cache index), spool (writer sessions of a cache
directory, and what becomes of a gone session's spool), committer (RemoteCommitter: the
commit path of an S3 store), groups (group commits over the bucket), parts (a group's staged
part as an object), gc (garbage collection: mark, grace, delete), gcmark (gc's pending mark,
gc/pending.json), reach (what checkpoints need of the bucket), gcguard (the writers' and
caches' side of gc).
"""
