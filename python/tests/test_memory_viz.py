"""memory_viz snapshots through the Python package (issue 38), on the simulated
driver, with neither PyTorch nor a GPU: ``flare_package.dump_snapshot(path)``
writes a pickle that Python's ``pickle`` loads, that the page's model
(``memory_viz_model.py``: blocks tile their segments, the trace replays back
from them, categories name "unknown") accepts, whose segments cover the tensor
pool and a graph pool with its id, and whose trace holds the calls this test made,
in order, with their sizes and its frame.

``FLARE_TORCH_HISTORY`` is set when this module is imported: unittest imports
every test module before it runs any, and the allocator reads the variable when
it is made (by the first test that runs).
"""

import copy
import ctypes
import os
import pathlib
import pickle
import sys
import tempfile
import unittest

os.environ.setdefault("FLARE_TORCH_HISTORY", "100000")

INSTALLED = os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") == "1"
CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
if not INSTALLED:
    sys.path.insert(0, str(CHECKOUT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import flare_package as fp  # noqa: E402
import memory_viz_model  # noqa: E402

MIB = 1 << 20
CAPACITY = 1 << 30
DEVICE = 1
FRAME = "memory-viz-test"


def setUpModule():
    try:
        fp.use_simulated(CAPACITY, 2)
    except fp.FlareError as e:
        # test_flare_package made it first, the same way.
        if "already made" not in str(e):
            raise


def stream(lib, device):
    s = ctypes.c_void_p()
    fp._check("stream_create", lib.flare_torch_sim_stream_create(device, ctypes.byref(s)))
    return s.value


def dump():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snapshot.pickle")
        fp.dump_snapshot(path)
        with open(path, "rb") as f:
            return pickle.load(f)


class DumpSnapshot(unittest.TestCase):
    def setUp(self):
        self.lib = fp.load()

    def tearDown(self):
        fp.set_history_frame(None)
        self.lib.flare_torch_reset()

    def test_the_calls_made_are_the_trace_and_the_segments_hold_them(self):
        lib = self.lib
        s = stream(lib, DEVICE)
        with fp.history_frame(FRAME):
            a = lib.flare_torch_alloc(1000, DEVICE, s)
            b = lib.flare_torch_alloc(3 * MIB, DEVICE, s)
            lib.flare_torch_free(a, 1000, DEVICE, s)
            # A capture into graph pool (21, 0).
            lib.flare_torch_begin_allocate_to_pool(DEVICE, 21, 0, None)
            fp._check("begin", lib.flare_torch_sim_begin_capture(DEVICE, s))
            g = lib.flare_torch_alloc(5 * MIB, DEVICE, s)
            valid = ctypes.c_int()
            fp._check("end", lib.flare_torch_sim_end_capture(DEVICE, s, ctypes.byref(valid)))
            lib.flare_torch_end_allocate_to_pool(DEVICE, 21, 0)
        snap = dump()
        summary = memory_viz_model.check(snap, replay_every=1)
        stats = fp.stats(DEVICE)
        # The model's totals are the pools' own counters.
        dev = [x for x in snap["segments"] if x["device"] == DEVICE]
        physical = stats["tensor"]["physical_bytes"] + sum(
            p["snapshot"]["physical_bytes"] for p in stats["graph_pools"]
        ) + stats["mempool"]["physical_bytes"]
        self.assertEqual(sum(x["total_size"] for x in dev), physical)
        self.assertGreater(summary["blocks"], 0)
        # This test's events (its frame), in the order of its calls.
        mine = [
            e
            for e in snap["device_traces"][DEVICE]
            if e["frames"] and e["frames"][0]["name"] == FRAME
        ]
        allocs_frees = [
            (e["action"], e["addr"], e["size"])
            for e in mine
            if not e["action"].startswith("segment")
        ]
        self.assertEqual(
            allocs_frees,
            [
                ("alloc", a, 1000),
                ("alloc", b, 3 * MIB),
                ("free_requested", a, 1000),
                ("free_completed", a, 1000),
                ("alloc", g, 5 * MIB),
            ],
        )
        maps = [e for e in mine if e["action"] == "segment_map"]
        self.assertGreaterEqual(len(maps), 2)
        self.assertTrue(all(e["size"] % (2 * MIB) == 0 for e in maps))
        self.assertTrue(all(e["stream"] == s for e in mine))
        # The graph pool's memory is in a segment of its id; b in the tensor pool's.
        def owner(p):
            for x in dev:
                if x["address"] <= p < x["address"] + x["total_size"]:
                    return x["segment_pool_id"]
            return None

        self.assertEqual(owner(g), (21, 0))
        self.assertEqual(owner(b), (0, 0))
        self.assertIn("unknown", {e.get("category") for t in snap["device_traces"] for e in t})
        lib.flare_torch_free(b, 3 * MIB, DEVICE, s)
        lib.flare_torch_free(g, 5 * MIB, DEVICE, s)
        lib.flare_torch_release_pool(DEVICE, 21, 0)

    def test_an_unwritable_path_raises_io(self):
        with self.assertRaises(fp.FlareError) as cm:
            fp.dump_snapshot("/nonexistent-flare-dir/x.pickle")
        self.assertEqual(cm.exception.status, "FLARE_STATUS_IO")


class Model(unittest.TestCase):
    """The model fails where the page would: a gap in a segment's blocks, a
    segment_map in no segment, categories without "unknown"."""

    def snapshot(self):
        lib = fp.load()
        p = lib.flare_torch_alloc(4096, DEVICE, None)
        q = lib.flare_torch_alloc(8192, DEVICE, None)
        snap = dump()
        lib.flare_torch_free(p, 4096, DEVICE, None)
        lib.flare_torch_free(q, 8192, DEVICE, None)
        lib.flare_torch_reset()
        memory_viz_model.check(snap)
        return snap

    def test_a_missing_block_fails(self):
        snap = copy.deepcopy(self.snapshot())
        seg = next(s for s in snap["segments"] if len(s["blocks"]) > 1)
        del seg["blocks"][0]
        with self.assertRaises(AssertionError):
            memory_viz_model.check(snap)

    def test_categories_without_unknown_fail(self):
        snap = copy.deepcopy(self.snapshot())
        for t in snap["device_traces"]:
            t[:] = [e for e in t if e.get("category") != "unknown"]
        with self.assertRaises(AssertionError):
            memory_viz_model.check(snap)

    def test_a_map_of_memory_no_segment_holds_fails(self):
        snap = copy.deepcopy(self.snapshot())
        trace = snap["device_traces"][DEVICE]
        trace.append(dict(trace[0], action="segment_map", addr=1 << 50, size=2 * MIB))
        with self.assertRaises(AssertionError):
            memory_viz_model.check(snap)


if __name__ == "__main__":
    unittest.main()
