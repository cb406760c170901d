"""A group's staged part as an object of the bucket (groups/<gid>/parts/<participant>): what
one participant of an S3 store's group commit stored (docs/design.md, "S3 stores").

    the framing of remote/envelope.py (magic SNAPPART; the header's length is the JSON's)
    around:
    JSON {"group", "participant", "stream", "parent", "meta", "buffers": [buffer entries'
          JSON], "new_chunks": n, "reused": n, "bytes_new"}
    the new-chunk table, the reused-chunk table (format.NEW_CHUNK entries: where each chunk
        the extents name lies), then each buffer's extents, in the order of "buffers"

With both tables the coordinator, on any machine, builds the group's checkpoint from the
parts alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from snapstore.engine import format as fmt
from snapstore.engine.records import BufferEntry, non_negative_int
from snapstore.remote import envelope, layout


@dataclass
class Part:
    """One participant's part of a group (see the module docstring)."""
    group: str
    participant: str
    stream: str
    parent: int | None
    meta: Any
    entries: list               # [BufferEntry] with extents
    new_chunks: bytes           # packed NEW_CHUNKs: chunks this part stored
    reused: bytes               # packed NEW_CHUNKs: the other chunks its extents name
    bytes_new: int


def encode(part: Part) -> bytes:
    doc = {"group": part.group, "participant": part.participant, "stream": part.stream,
           "parent": part.parent, "meta": part.meta,
           "buffers": [e.to_json() for e in part.entries],
           "new_chunks": len(part.new_chunks) // fmt.NEW_CHUNK.size,
           "reused": len(part.reused) // fmt.NEW_CHUNK.size, "bytes_new": part.bytes_new}
    text = json.dumps(doc, separators=(",", ":")).encode()
    return envelope.seal(layout.PART_MAGIC, layout.PART_VERSION, len(text),
                         [text, part.new_chunks, part.reused]
                         + [e.extents for e in part.entries])


def decode(data: bytes, key: str) -> Part:
    """The Part of an object; CorruptionError naming the key when it is damaged, FormatError
    when it is of a newer version."""
    what = "group part object"
    head, length, end = envelope.unseal(data, key, what, "a group part", layout.PART_MAGIC,
                                        layout.PART_VERSION)
    try:
        doc = json.loads(bytes(data[head:head + length]))
        pos = head + length
        tables = []
        for n in (doc["new_chunks"], doc["reused"]):
            size = non_negative_int(n) * fmt.NEW_CHUNK.size
            tables.append(bytes(data[pos:pos + size]))
            pos += size
        entries = []
        for bj in doc["buffers"]:
            size = non_negative_int(bj["extents"]) * fmt.EXTENT.size
            entries.append(BufferEntry.from_json(bj, bytes(data[pos:pos + size])))
            pos += size
        parent = doc["parent"]
        part = Part(str(doc["group"]), str(doc["participant"]), str(doc["stream"]),
                    None if parent is None else int(parent), doc["meta"], entries, tables[0],
                    tables[1], non_negative_int(doc["bytes_new"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise envelope.damaged(what, key, f"its description does not decode: {exc!r}") \
            from None
    if pos != end:
        raise envelope.damaged(what, key, "lengths do not match")
    return part
