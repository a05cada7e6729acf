"""What PyTorch's memory_viz page does with a snapshot, as checks (issue 38).

``check(snapshot)`` takes a snapshot as loaded with ``pickle`` and raises
``AssertionError`` where the page (``torch/utils/viz/MemoryViz.js``) or
``torch.cuda._memory_viz`` would fail or draw something false:

- every segment is tiled by its blocks, in address order from its address
  (the page gives block i the address of the segment plus the sizes before it;
  ``_memory_viz.segsum`` asserts the bytes add up), and its ``allocated_size``,
  ``active_size`` and ``requested_size`` are those of its blocks;
- no two segments of a device overlap;
- every trace event has the keys the page reads, and an action it knows;
- categories: when the events name categories, one of them is ``"unknown"``
  (else the page's ``annotate_snapshot`` throws on a misspelled list);
- the page's segment view replays the trace backwards from the segments
  (``simulate_memory``): a ``free_requested`` not followed by its
  ``free_completed`` needs its block, a ``segment_map`` needs a segment that
  holds it, and after each step every block lies inside a segment (the view
  looks each block's segment up and fails on none).

Run as a script: ``python3 memory_viz_model.py SNAPSHOT.pickle [EXPECT.json]``
prints a summary as JSON; EXPECT.json (``{"actions": [[action, addr, size],
...], "segments": N, "allocated_bytes": N, "total_bytes": N}``, each key
optional) is compared with what the pickle holds. Standard library only.
"""

import json
import pickle
import sys

ACTIONS = {
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
}
STATES = {"active_allocated", "active_pending_free", "inactive"}
SEGMENT_KEYS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)
BLOCK_KEYS = ("address", "size", "requested_size", "state", "frames")
EVENT_KEYS = ("action", "addr", "size", "stream", "time_us", "frames")


def _check_frames(frames, where):
    assert isinstance(frames, list), f"{where}: frames is not a list"
    for f in frames:
        assert isinstance(f.get("filename"), str), f"{where}: frame filename"
        assert isinstance(f.get("name"), str), f"{where}: frame name"
        assert isinstance(f.get("line"), int), f"{where}: frame line"


def check_segments(snapshot):
    """The segments' tiling and sums; returns (segments, blocks, total, allocated)."""
    blocks = 0
    total = 0
    allocated = 0
    by_device = {}
    for i, seg in enumerate(snapshot["segments"]):
        where = f"segment {i}"
        for k in SEGMENT_KEYS:
            assert k in seg, f"{where}: no {k!r}"
        _check_frames(seg["frames"], where)
        addr = seg["address"]
        active = 0
        requested = 0
        for j, b in enumerate(seg["blocks"]):
            bw = f"{where} block {j}"
            for k in BLOCK_KEYS:
                assert k in b, f"{bw}: no {k!r}"
            assert b["state"] in STATES, f"{bw}: state {b['state']!r}"
            assert b["address"] == addr, f"{bw}: at {b['address']:#x}, expected {addr:#x}"
            assert b["size"] > 0, f"{bw}: size {b['size']}"
            _check_frames(b["frames"], bw)
            if b["state"] != "inactive":
                assert b["requested_size"] <= b["size"], f"{bw}: requested over size"
                active += b["size"]
                requested += b["requested_size"]
            addr += b["size"]
            blocks += 1
        assert addr == seg["address"] + seg["total_size"], (
            f"{where}: blocks end at {addr:#x}, segment at "
            f"{seg['address'] + seg['total_size']:#x}"
        )
        assert seg["allocated_size"] == active, f"{where}: allocated_size"
        assert seg["active_size"] == active, f"{where}: active_size"
        assert seg["requested_size"] == requested, f"{where}: requested_size"
        by_device.setdefault(seg["device"], []).append((seg["address"], seg["total_size"]))
        total += seg["total_size"]
        allocated += active
    for device, ranges in by_device.items():
        ranges.sort()
        for (a, n), (b, _) in zip(ranges, ranges[1:]):
            assert a + n <= b, f"device {device}: segments at {a:#x} and {b:#x} overlap"
    return len(snapshot["segments"]), blocks, total, allocated


def check_categories(snapshot):
    cats = set()
    for trace in snapshot["device_traces"]:
        for e in trace:
            if "category" in e:
                cats.add(e["category"])
    assert not cats or "unknown" in cats, (
        f"categories {sorted(cats)} without 'unknown': MemoryViz.js throws"
    )


def _annotate(trace):
    """The page's elision: a free_requested followed by its free_completed is one
    'free' event."""
    out = []
    for e in trace:
        if (
            e["action"] == "free_completed"
            and out
            and out[-1]["action"] == "free_requested"
            and out[-1]["addr"] == e["addr"]
        ):
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(e)
    return out


def _inside(segments, addr, size=1):
    return any(a <= addr and addr + size <= a + n for a, n, _ in segments)


def _map_segment(segments, seg):
    """The page's map_segment(merge=true): inserted in address order, merged with
    a neighbour of its stream that it touches."""
    segments.append(seg)
    segments.sort(key=lambda s: s[0])
    i = segments.index(seg)
    if i + 1 < len(segments):
        nxt = segments[i + 1]
        if seg[0] + seg[1] == nxt[0] and seg[2] == nxt[2]:
            seg[1] += nxt[1]
            del segments[i + 1]
    if i > 0:
        prev = segments[i - 1]
        if prev[0] + prev[1] == seg[0] and prev[2] == seg[2]:
            prev[1] += seg[1]
            del segments[i]


def _unmap_segment(segments, addr, size, where):
    """The page's unmap_segment(merge=true): the one segment holding the range
    loses it (it throws when none does)."""
    end = addr + size
    held = [s for s in segments if s[0] <= addr and end <= s[0] + s[1]]
    assert held, f"{where}: segment_map at {addr:#x} ({size} bytes) in no one segment"
    s = held[0]
    s_end = s[0] + s[1]
    if s[0] == addr:
        s[0] += size
        s[1] -= size
        if s[1] == 0:
            segments.remove(s)
    elif s_end == end:
        s[1] -= size
    else:
        s[1] = addr - s[0]
        segments.append([end, s_end - end, s[2]])


def replay_segment_view(snapshot, device, every=1):
    """The segment view's replay, from the last event back to the first; checks the
    blocks lie in segments after each `every`-th step."""
    segments = []
    blocks = {}
    for seg in snapshot["segments"]:
        if seg["device"] != device:
            continue
        segments.append([seg["address"], seg["total_size"], seg["stream"]])
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = b["size"]
    events = _annotate(snapshot["device_traces"][device])
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        a = e["action"]
        where = f"event {i} ({a})"
        if a in ("free", "free_completed"):
            blocks[e["addr"]] = e["size"]
        elif a == "free_requested":
            assert e["addr"] in blocks, f"{where}: free_requested of no block"
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "segment_unmap":
            _map_segment(segments, [e["addr"], e["size"], e["stream"]])
        elif a == "segment_free":
            segments.append([e["addr"], e["size"], e["stream"]])
        elif a == "segment_map":
            _unmap_segment(segments, e["addr"], e["size"], where)
        elif a == "segment_alloc":
            held = [s for s in segments if s[0] == e["addr"]]
            assert held, f"{where}: segment_alloc of no segment"
            segments.remove(held[0])
        if i % every == 0:
            for addr in blocks:
                assert _inside(segments, addr), (
                    f"before {where}: block {addr:#x} in no segment"
                )
    return len(events)


def check(snapshot, replay_every=None):
    """Every check above; returns a summary dict."""
    assert isinstance(snapshot, dict), "a snapshot is a dict"
    assert isinstance(snapshot.get("segments"), list), "no segments list"
    assert isinstance(snapshot.get("device_traces"), list), "no device_traces list"
    nseg, nblocks, total, allocated = check_segments(snapshot)
    for device, trace in enumerate(snapshot["device_traces"]):
        for i, e in enumerate(trace):
            for k in EVENT_KEYS:
                assert k in e, f"device {device} event {i}: no {k!r}"
            assert e["action"] in ACTIONS, f"event {i}: action {e['action']!r}"
            _check_frames(e["frames"], f"event {i}")
            if e["action"] == "oom":
                assert "device_free" in e, f"event {i}: oom without device_free"
        every = replay_every or max(1, len(trace) // 500)
        replay_segment_view(snapshot, device, every)
    check_categories(snapshot)
    return {
        "segments": nseg,
        "blocks": nblocks,
        "events": sum(len(t) for t in snapshot["device_traces"]),
        "total_bytes": total,
        "allocated_bytes": allocated,
        "actions": [
            [e["action"], e["addr"], e["size"]]
            for t in snapshot["device_traces"]
            for e in t
        ],
    }


def main(argv):
    with open(argv[1], "rb") as f:
        snapshot = pickle.load(f)
    summary = check(snapshot)
    if len(argv) > 2:
        with open(argv[2]) as f:
            expect = json.load(f)
        for key, want in expect.items():
            got = summary[key]
            assert got == want, f"{key}: pickle has {got}, expected {want}"
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
