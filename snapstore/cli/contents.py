"""The contents section of `snapstore show`: the tensors of a torch, object, array or DCP
checkpoint (name, dtype, shape, where its bytes are), or the channels and messages of a
LangGraph checkpoint, decoded. contents_json() gathers it (while the store is open);
contents_lines() / print_contents() format it for people, the tensor table cut after TABLE_ROWS rows."""
from __future__ import annotations

from collections import Counter
from typing import Any

from snapstore.formatting import human_bytes, printable, text_table
from snapstore.tensors import catalogue

TABLE_ROWS = 30            # tensors listed by `show` without --json
VALUES_SHOWN = 8           # plain values listed
MESSAGES_SHOWN = 20        # last messages listed


def _is_langgraph(info) -> bool:
    meta = info.meta
    return info.stream.startswith("lg/") and isinstance(meta, dict) and \
        {"t", "ns", "id", "ck", "ch"} <= set(meta)


def contents_json(store, info) -> Any:
    """What the checkpoint holds, as JSON: {"kind": "tensors", ...catalogue...},
    {"kind": "langgraph", ...decoded...}, or None for plain checkpoints."""
    if _is_langgraph(info):
        try:
            from snapstore.langgraph import describe_checkpoint
        except ImportError:
            return {"kind": "langgraph", "decoded": False,
                    "note": "install snapstore[langgraph] to decode channels and messages"}
        return {"kind": "langgraph", "decoded": True, **describe_checkpoint(store, info)}
    cat = catalogue(store, info)
    if cat.kind not in ("objects", "arrays", "dcp"):
        return None
    return {"kind": "tensors", "layout": cat.kind,
            "tensors": [e.to_json() for e in cat.tensors],
            "values": cat.values, "skipped": cat.skipped}


def contents_lines(doc: Any) -> list:
    """Lines for people from contents_json()'s document ([] for None)."""
    if not doc:
        return []
    if doc["kind"] == "langgraph":
        return _langgraph_lines(doc)
    return _tensor_lines(doc)


def print_contents(doc: Any) -> None:
    """Prints contents_lines(doc) after a blank line (nothing for plain checkpoints)."""
    lines = contents_lines(doc)
    if lines:
        print()
        print("\n".join(lines))


def _shape(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ")" if len(shape) != 1 else f"({shape[0]},)"


def _tensor_lines(doc: dict) -> list:
    tensors = doc["tensors"]
    total = sum(t["nbytes"] for t in tensors)
    dtypes = Counter(t["dtype"] for t in tensors)
    mix = ", ".join(f"{n} {d}" for d, n in dtypes.most_common(4))
    lines = [f"contents ({doc['layout']}): {len(tensors)} tensor(s), {human_bytes(total)}"
             + (f" ({mix}{', ...' if len(dtypes) > 4 else ''})" if tensors else "")]
    if tensors:
        rows = [[t["name"], t["dtype"], _shape(t["shape"]), t["buffer"], human_bytes(t["nbytes"])]
                for t in tensors[:TABLE_ROWS]]
        lines += ["  " + line for line in text_table(["TENSOR", "DTYPE", "SHAPE", "BUFFER",
                                                      "SIZE"], rows, right=(4,)).splitlines()]
        if len(tensors) > TABLE_ROWS:
            lines.append(f"  ... {len(tensors) - TABLE_ROWS} more tensors (--json lists all)")
    values = doc["values"]
    if values:                           # the shallowest first: "step" before hyperparameters
        names = sorted(values, key=lambda k: k.count("."))[:VALUES_SHOWN]
        shown = ", ".join(f"{k}={values[k]!r:.30}" for k in names)
        more = f", ... ({len(values)} values)" if len(values) > VALUES_SHOWN else ""
        lines.append(f"  values: {shown}{more}")
    if doc["skipped"]:
        lines.append(f"  not tensors: {', '.join(list(doc['skipped'])[:VALUES_SHOWN])}"
                     + (" ..." if len(doc["skipped"]) > VALUES_SHOWN else ""))
    return [printable(line) for line in lines]


def _langgraph_lines(doc: dict) -> list:
    if not doc["decoded"]:
        return [f"contents (LangGraph): not decoded: {doc['note']}"]
    md = doc["metadata"]
    lines = [f"contents (LangGraph): thread {doc['thread_id']!r}"
             + (f" ns {doc['checkpoint_ns']!r}" if doc["checkpoint_ns"] else "")
             + f", checkpoint {doc['checkpoint_id']}"
             + (f", step {md['step']}" if "step" in md else "")
             + (f", source {md['source']}" if "source" in md else "")]
    rows = [[c["name"], c["version"], c["type"], c["preview"]] for c in doc["channels"]]
    if rows:
        lines += ["  " + line for line in text_table(["CHANNEL", "VERSION", "TYPE", "VALUE"],
                                                     rows).splitlines()]
    messages = doc["messages"]
    if messages:
        lines.append(f"  messages ({len(messages)}"
                     + (f", last {MESSAGES_SHOWN}" if len(messages) > MESSAGES_SHOWN else "")
                     + "):")
        for m in messages[-MESSAGES_SHOWN:]:
            calls = f" [tool calls: {', '.join(m['tool_calls'])}]" if m.get("tool_calls") else ""
            lines.append(f"    {m['role']:>9}: {m['content']}{calls}")
    return [printable(line) for line in lines]
