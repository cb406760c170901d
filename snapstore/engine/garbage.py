"""Which chunk entries garbage collection frees (format 5: with the delta chunks' edges).

A chunk's reference count is the extents naming it plus the delta chunks naming it as their
base (docs/design.md, invariant 4). Garbage is what no extent uses and no chunk that stays
needs as its base: a delta chunk that goes takes its edge off its base, which may go too. One
rule for compaction's GC, its choice of segments and stats().
"""
from __future__ import annotations

from typing import Mapping


def collectable(entries: Mapping, pinned=frozenset()) -> set[bytes]:
    """The ids of the chunk entries ({chunk id: ChunkEntry}) that garbage collection frees:
    count 0 and not pinned (an operation in progress reuses it), then, as each goes, its
    base when that edge was the base's last reference."""
    refs = {cid: e.refs for cid, e in entries.items()}
    todo = [cid for cid, n in refs.items() if n <= 0 and cid not in pinned]
    dead: set[bytes] = set()
    while todo:
        cid = todo.pop()
        if cid in dead:
            continue
        dead.add(cid)
        base = entries[cid].base
        if base is not None and base in refs and base not in dead:
            refs[base] -= 1
            if refs[base] <= 0 and base not in pinned:
                todo.append(base)
    return dead
