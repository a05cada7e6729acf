"""CI tests of the Python package that need neither PyTorch nor a GPU: the library
is found and loaded, a missing one is reported with every path tried, and the
PyTorch entry points are driven through ctypes on the simulated driver (as PyTorch
would call them: alloc/free with streams, the graph-pool hooks around a capture,
record_stream, reset), with stats, trim, retention and the out-of-memory path; and
sleep / wake / census of a device's tensor memory, the zeroing wake included; the
growth report (mark_step, growth_report).

Run from the checkout: python3 -m unittest discover -s python/tests (after
`cargo clib`): the checkout's
package, python/flare_package, with target/release/libflare_package.so. With
FLARE_PACKAGE_TEST_INSTALLED=1 the tests import the package installed in the
interpreter (`pip install ./python`) and check that its library is the one inside it
(tests/python/install.sh runs them so in a fresh virtual environment).
"""

import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

INSTALLED = os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") == "1"
CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
if not INSTALLED:
    sys.path.insert(0, str(CHECKOUT / "python"))
import flare_package as fp  # noqa: E402

MIB = 1 << 20
CAPACITY = 1 << 30  # each simulated device: 1 GiB


def setUpModule():
    fp.use_simulated(CAPACITY, 2)


def stream(lib, device):
    s = ctypes.c_void_p()
    fp._check("stream_create", lib.flare_torch_sim_stream_create(device, ctypes.byref(s)))
    return s.value


def faults(lib, device):
    n = ctypes.c_uint64()
    fp._check("faults", lib.flare_torch_sim_faults(device, ctypes.byref(n)))
    return n.value


class Loading(unittest.TestCase):
    def test_loads_the_library_with_every_entry_point(self):
        path = fp.library_path()
        package = pathlib.Path(fp.__file__).resolve().parent
        if INSTALLED:
            # pip put the package, and maturin the library inside it, in the
            # interpreter's platform site-packages (the wheel is not pure Python).
            site = pathlib.Path(sysconfig.get_paths()["platlib"]).resolve()
            self.assertEqual(package, site / "flare_package")
            self.assertEqual(path, site / "flare_package" / "_native" / "lib_native.so")
        elif not os.environ.get(fp.LIB_ENV):
            self.assertEqual(package, CHECKOUT / "python" / "flare_package")
            # An editable install (`pip install -e ./python`) puts the library in
            # the checkout's package; otherwise it is cargo's.
            editable = package / "_native" / "lib_native.so"
            cargo = CHECKOUT / "target" / "release" / "libflare_package.so"
            self.assertEqual(path, editable if editable.is_file() else cargo)
        lib = fp.load()
        for name in (
            "flare_torch_alloc",
            "flare_torch_free",
            "flare_torch_record_stream",
            "flare_torch_reset",
            "flare_torch_begin_allocate_to_pool",
            "flare_torch_end_allocate_to_pool",
            "flare_torch_release_pool",
            "flare_torch_pool_alloc",
            "flare_torch_pool_free",
        ):
            self.assertTrue(fp._addr(lib, name), name)

    def test_a_missing_library_names_every_path_tried(self):
        # The package copied where no library is, FLARE_PACKAGE_LIB unset.
        with tempfile.TemporaryDirectory() as tmp:
            pkg = pathlib.Path(tmp) / "a" / "b" / "flare_package"
            shutil.copytree(pathlib.Path(fp.__file__).parent, pkg, ignore=shutil.ignore_patterns("_native", "__pycache__"))
            env = {k: v for k, v in os.environ.items() if k != fp.LIB_ENV}
            r = subprocess.run(
                [sys.executable, "-c", "import flare_package; flare_package.load()"],
                cwd=pkg.parent, env=env, capture_output=True, text=True,
            )
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("LibraryNotFound", r.stderr)
            self.assertIn(str(pkg / "_native" / "lib_native.so"), r.stderr)
            self.assertIn(str(pathlib.Path(tmp) / "a" / "target" / "release" / "libflare_package.so"), r.stderr)
            self.assertIn("`pip install ./python`", r.stderr)
            self.assertIn("`cargo clib`", r.stderr)

    def test_the_variable_names_the_library_alone(self):
        old = os.environ.get(fp.LIB_ENV)
        os.environ[fp.LIB_ENV] = "/nonexistent/libflare_package.so"
        try:
            with self.assertRaises(fp.LibraryNotFound) as cm:
                fp.library_path()
            self.assertIn("/nonexistent/libflare_package.so", str(cm.exception))
            self.assertIn("FLARE_PACKAGE_LIB is set", str(cm.exception))
        finally:
            if old is None:
                del os.environ[fp.LIB_ENV]
            else:
                os.environ[fp.LIB_ENV] = old


    def test_a_library_that_is_not_ours_is_named_not_an_attribute_error(self):
        # FLARE_PACKAGE_LIB pointing at a real shared library without our functions
        # (the C library: loads fine, has no flare_torch_alloc).
        found = [p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib64/libc.so.6") if os.path.exists(p)]
        self.assertTrue(found, "no libc.so.6 at the usual paths")
        path = found[0]
        env = dict(os.environ, **{fp.LIB_ENV: path})
        r = subprocess.run(
            [sys.executable, "-c", "import flare_package; flare_package.load()"],
            cwd=pathlib.Path(fp.__file__).parent.parent, env=env, capture_output=True, text=True,
        )
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LibraryNotFound", r.stderr)
        self.assertIn("has no function flare_torch_alloc", r.stderr)
        self.assertNotIn("AttributeError:", r.stderr.splitlines()[-1])


class Simulated(unittest.TestCase):
    """Device 0 and 1 of the simulated driver; each test leaves its device's pools
    empty."""

    def setUp(self):
        self.lib = fp.load()

    def tearDown(self):
        self.lib.flare_torch_reset()

    def test_per_tensor_blocks_share_a_handle_and_trim_releases_them(self):
        lib = self.lib
        ptrs = [lib.flare_torch_alloc(4096, 0, None) for _ in range(100)]
        self.assertTrue(all(ptrs))
        self.assertEqual(len(set(ptrs)), 100)
        s = fp.stats(0)
        self.assertTrue(s["created"])
        self.assertEqual(s["backend"], "sim")
        # Segments: 100 blocks of 4 KiB in one 2 MiB handle.
        self.assertEqual(s["tensor"]["physical_bytes"], 2 * MIB)
        self.assertEqual(s["tensor"]["block_live_bytes"], 100 * 4096)
        for p in ptrs:
            lib.flare_torch_free(p, 4096, 0, None)
        # Freed memory stays cached (release threshold max) until trim.
        self.assertEqual(fp.stats(0)["tensor"]["block_live_count"], 0)
        self.assertEqual(fp.stats(0)["tensor"]["physical_bytes"], 2 * MIB)
        fp.trim(0)
        self.assertEqual(fp.stats(0)["physical_bytes"], 0)

    def test_out_of_range_devices_and_sizes_are_refused_not_wrapped(self):
        # ctypes wraps ints silently (device 2**32 was device 0, 1.7 was device 1).
        for bad in (2**32, 2**31, -1):
            with self.assertRaises(ValueError):
                fp.stats(bad)
            with self.assertRaises(ValueError):
                fp.trim(bad)
            with self.assertRaises(ValueError):
                with fp.retention(bad):
                    pass
        for bad in (1.7, "0", True):
            with self.assertRaises(TypeError):
                fp.stats(bad)
        with self.assertRaises(ValueError):
            fp.use_simulated(-1)
        with self.assertRaises(ValueError):
            fp.use_simulated(2**64)
        with self.assertRaises(ValueError):
            fp.use_simulated(0, 2**32)
        # In range for ctypes, impossible for a machine: refused by the library
        # before it looks at whether the allocator is made (1 byte holds no 2 MiB
        # granule; the simulator has at most 128 devices).
        with self.assertRaisesRegex(fp.FlareError, "less than one granule"):
            fp.use_simulated(1, 2)
        with self.assertRaisesRegex(fp.FlareError, "at most 128"):
            fp.use_simulated(0, 129)

    def test_a_device_the_machine_lacks_is_refused_by_every_call_alike(self):
        # The simulated machine has 2 devices (setUpModule): device 5 is in range for
        # the library (0..64) but does not exist; stats and trim, which create no
        # pool, refuse it as retention (which does) does, and create nothing.
        for call in (lambda: fp.stats(5), lambda: fp.trim(5)):
            with self.assertRaisesRegex(fp.FlareError, "device 5 does not exist"):
                call()
        with self.assertRaisesRegex(fp.FlareError, "device 5 does not exist"):
            with fp.retention(5):
                pass

    def test_zero_bytes_is_null_without_an_error_and_its_free_is_nothing(self):
        # PyTorch asks for 0 bytes (an empty tensor's storage) and frees the NULL it
        # got: PyTorch's own allocator returns NULL there, and no handler may throw.
        lib = self.lib
        seen = []
        handler_t = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p)
        handler = handler_t(lambda func, file, line, m: seen.append(m))
        lib.flare_torch_set_oom_handler(ctypes.cast(handler, ctypes.c_void_p))
        try:
            before = fp.stats(0)["tensor"]
            self.assertIsNone(lib.flare_torch_alloc(0, 0, None))
            lib.flare_torch_free(None, 0, 0, None)
        finally:
            lib.flare_torch_set_oom_handler(None)
        self.assertEqual(seen, [])
        after = fp.stats(0)["tensor"]
        self.assertEqual(after["allocations"], before["allocations"])
        self.assertEqual(after["frees"], before["frees"])

    def test_frees_are_stream_ordered_and_record_stream_is_honoured(self):
        lib = self.lib
        s, t = stream(lib, 0), stream(lib, 0)
        p = lib.flare_torch_alloc(MIB, 0, s)
        fp._check("launch", lib.flare_torch_sim_launch(0, t, p, MIB))  # used on t
        lib.flare_torch_record_stream(p, t)
        lib.flare_torch_free(p, MIB, 0, s)
        fp._check("complete", lib.flare_torch_sim_stream_complete(0, s))
        q = lib.flare_torch_alloc(MIB, 0, s)
        self.assertNotEqual(q, p, "reused while t's kernel still uses it")
        self.assertEqual(faults(lib, 0), 0)
        fp._check("complete", lib.flare_torch_sim_stream_complete(0, t))
        lib.flare_torch_free(q, MIB, 0, s)

    def test_a_forgotten_streams_handle_reused_by_a_new_stream_starts_clean(self):
        # The simulated driver gives a destroyed stream's handle to the next stream.
        # Forgotten first, the old stream's block (its kernel still running) is not
        # handed to the new stream: a block of a heap of its own, no fault.
        lib = self.lib
        s = stream(lib, 0)
        p = lib.flare_torch_alloc(MIB, 0, s)
        fp._check("launch", lib.flare_torch_sim_launch(0, s, p, MIB))
        lib.flare_torch_free(p, MIB, 0, s)
        fp.forget_stream(s)
        fp._check("destroy", lib.flare_torch_sim_stream_destroy(0, s))
        t = stream(lib, 0)
        self.assertEqual(t, s, "the handle is handed out again")
        q = lib.flare_torch_alloc(MIB, 0, t)
        self.assertNotEqual(q, p, "the old stream's kernel still uses p")
        self.assertEqual(faults(lib, 0), 0)
        # Two 2 MiB handles: the forgotten stream's heap and the new stream's.
        self.assertEqual(fp.stats(0)["tensor"]["physical_bytes"], 4 * MIB)
        lib.flare_torch_free(q, MIB, 0, t)
        fp.trim(0)
        self.assertEqual(fp.stats(0)["physical_bytes"], 0)
        self.assertEqual(faults(lib, 0), 0)
        fp._check("destroy", lib.flare_torch_sim_stream_destroy(0, t))

    def test_forget_stream_refuses_default_and_capturing_streams(self):
        lib = self.lib
        for default in (0, 1, 2):
            with self.assertRaises(fp.FlareError) as cm:
                fp.forget_stream(default)
            self.assertEqual(cm.exception.status, "FLARE_STATUS_INVALID_ARGUMENT")
        for bad in (-1, 2**64):
            with self.assertRaises(ValueError):
                fp.forget_stream(bad)
        with self.assertRaises(TypeError):
            fp.forget_stream("0x10")
        s = stream(lib, 0)
        p = lib.flare_torch_alloc(MIB, 0, s)
        lib.flare_torch_free(p, MIB, 0, s)
        fp._check("begin", lib.flare_torch_sim_begin_capture(0, s))
        with self.assertRaises(fp.FlareError) as cm:
            fp.forget_stream(s)
        self.assertEqual(cm.exception.status, "FLARE_STATUS_STREAM_STATE")
        valid = ctypes.c_int()
        fp._check("end", lib.flare_torch_sim_end_capture(0, s, ctypes.byref(valid)))
        self.assertEqual(valid.value, 1, "the refused forget broke nothing")
        # Nothing changed: s takes its block back at once.
        self.assertEqual(lib.flare_torch_alloc(MIB, 0, s), p)
        lib.flare_torch_free(p, MIB, 0, s)

        class Wrapped:  # what torch.cuda.ExternalStream gives: .cuda_stream
            cuda_stream = s

        fp.forget_stream(Wrapped())
        fp.forget_stream(Wrapped())  # a second time: nothing to forget
        fp._check("destroy", lib.flare_torch_sim_stream_destroy(0, s))
        self.assertEqual(faults(lib, 0), 0)

    def test_graph_pool_hooks_keep_capture_memory_to_the_graph(self):
        lib = self.lib
        s = stream(lib, 0)
        failures = fp.hook_failures()
        lib.flare_torch_begin_allocate_to_pool(0, 11, 0, None)
        fp._check("begin", lib.flare_torch_sim_begin_capture(0, s))
        tmp = lib.flare_torch_alloc(3 * MIB, 0, s)
        out = lib.flare_torch_alloc(MIB, 0, s)
        lib.flare_torch_free(tmp, 3 * MIB, 0, s)
        valid = ctypes.c_int()
        fp._check("end", lib.flare_torch_sim_end_capture(0, s, ctypes.byref(valid)))
        self.assertEqual(valid.value, 1, "the capture stayed valid")
        lib.flare_torch_end_allocate_to_pool(0, 11, 0)
        graphs = fp.stats(0)["graph_pools"]
        self.assertEqual([(g["id"], g["live"]) for g in graphs], [([11, 0], 1)])
        self.assertEqual(fp.stats(0)["tensor"]["block_live_count"], 0)
        # Eager allocations never get the graph's memory, before or after the
        # graph's output is freed; empty_cache (reset) keeps it.
        lib.flare_torch_free(out, MIB, 0, s)
        eager = [lib.flare_torch_alloc(n, 0, s) for n in (MIB, 3 * MIB)]
        self.assertFalse({tmp, out} & set(eager))
        for p in eager:
            lib.flare_torch_free(p, 0, 0, s)
        lib.flare_torch_reset()
        self.assertGreaterEqual(fp.stats(0)["graph_pools"][0]["snapshot"]["physical_bytes"], 4 * MIB)
        # PyTorch releases the pool: destroyed, everything back to the device.
        lib.flare_torch_release_pool(0, 11, 0)
        self.assertEqual(fp.stats(0)["graph_pools"], [])
        self.assertEqual(fp.stats(0)["physical_bytes"], 0)
        self.assertEqual(fp.hook_failures(), failures)
        self.assertEqual(faults(lib, 0), 0)

    def test_mempool_functions_hold_exactly_the_segments(self):
        lib = self.lib
        a = lib.flare_torch_pool_alloc(2 * MIB, 1, None)
        b = lib.flare_torch_pool_alloc(20 * MIB, 1, None)
        self.assertEqual(fp.stats(1)["mempool"]["physical_bytes"], 22 * MIB)
        lib.flare_torch_pool_free(b, 20 * MIB, 1, None)
        self.assertEqual(fp.stats(1)["mempool"]["physical_bytes"], 2 * MIB)
        lib.flare_torch_pool_free(a, 2 * MIB, 1, None)
        self.assertEqual(fp.stats(1)["mempool"]["physical_bytes"], 0)

    def test_out_of_memory_reports_the_request_and_the_pool_stays_usable(self):
        lib = self.lib
        held = lib.flare_torch_alloc(600 * MIB, 0, None)
        self.assertTrue(held)
        self.assertIsNone(lib.flare_torch_alloc(600 * MIB, 0, None))
        msg = fp.last_error()
        self.assertIn(f"request of {600 * MIB} bytes on device 0", msg)
        self.assertIn("out of memory", msg)
        self.assertIn(f"{600 * MIB} bytes live", msg)
        self.assertIn("bytes idle", msg)
        # With a handler set, it is called (PyTorch's would throw) with the message.
        seen = []
        handler_t = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p)
        handler = handler_t(lambda func, file, line, m: seen.append((func, m.decode())))
        lib.flare_torch_set_oom_handler(ctypes.cast(handler, ctypes.c_void_p))
        try:
            self.assertIsNone(lib.flare_torch_alloc(4 << 30, 0, None))
        finally:
            lib.flare_torch_set_oom_handler(None)
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0][0], b"flare_torch_alloc")
        self.assertIn(f"request of {4 << 30} bytes", seen[0][1])
        self.assertIn("request too large", seen[0][1])
        lib.flare_torch_free(held, 0, 0, None)
        again = lib.flare_torch_alloc(900 * MIB, 0, None)
        self.assertTrue(again, "the pool serves the next request")
        lib.flare_torch_free(again, 0, 0, None)

    def test_retention_scope_and_errors(self):
        lib = self.lib
        with fp.retention(1):
            p = lib.flare_torch_alloc(8 * MIB, 1, None)
            lib.flare_torch_free(p, 0, 1, None)
            with self.assertRaises(fp.FlareError) as cm:
                fp.trim(1)
            self.assertEqual(cm.exception.status, "FLARE_STATUS_SCOPE_STATE")
        self.assertEqual(fp.stats(1)["tensor"]["physical_bytes"], 0)
        self.assertEqual(fp.stats(1)["tensor"]["scopes_finished"], 1)
        failures = fp.hook_failures()
        lib.flare_torch_free(0xDEAD000, 0, 1, None)  # not ours
        self.assertEqual(fp.hook_failures(), failures + 1)
        self.assertIn("unknown pointer", fp.last_error())
        self.assertIsNone(lib.flare_torch_alloc(MIB, 64, None))
        self.assertIn("device ordinal 64", fp.last_error())
        with self.assertRaises(fp.FlareError) as cm:
            fp.use_simulated()  # already made, by the first use_simulated
        self.assertIn("earlier flare_torch_use_simulated", str(cm.exception))
        self.assertIn("must be the first call, once", str(cm.exception))



def sim_write(lib, device, ptr, data):
    fp._check("flare_torch_sim_write", lib.flare_torch_sim_write(device, ptr, data, len(data)))


def sim_read(lib, device, ptr, n):
    buf = ctypes.create_string_buffer(n)
    fp._check("flare_torch_sim_read", lib.flare_torch_sim_read(device, ptr, buf, n))
    return buf.raw


class GrowthReport(unittest.TestCase):
    """mark_step() and growth_report() over a device's tensor pool (issue 38)."""

    def test_a_tensor_kept_every_step_is_named_with_its_rate(self):
        lib = fp.load()
        size = 3 * MIB + 4096  # no other test allocates it
        s = stream(lib, 1)
        before = fp.growth_report(1, as_dict=True)
        kept = []
        for _ in range(40):
            fp.mark_step()
            kept.append(lib.flare_torch_alloc(size, 1, s))
            t = lib.flare_torch_alloc(5 * MIB, 1, s)
            lib.flare_torch_free(t, 5 * MIB, 1, s)
        self.assertTrue(all(kept))
        r = fp.growth_report(1, as_dict=True)
        self.assertEqual(r["step_kind"], "markers")
        self.assertEqual(r["markers"], before["markers"] + 40)
        self.assertEqual(r["steps"], r["markers"] + 1)
        ours = [g for g in r["groups"] if g["bytes"] == size]
        self.assertEqual(len(ours), 1, r)
        g = ours[0]
        # Made in the last 40 steps, one each: 39 gained over the 39 steps after
        # the first.
        self.assertEqual((g["tag"], g["count"], g["distinct_steps"]), (0, 40, 40))
        self.assertEqual((g["first_step"], g["last_step"]), (r["steps"] - 40, r["steps"] - 1))
        self.assertEqual((g["added_count"], g["steps_after_first"]), (39, 39))
        self.assertEqual(g["allocations_per_step"], 1.0)
        self.assertTrue(g["grows"])
        self.assertEqual(r["groups"][0], g, "the groups that grow come first")
        text = fp.growth_report(1)
        self.assertIn("growing, most bytes per step first:\n", text)
        self.assertIn(f"  tag 0, 3.0 MiB ({size} B) each: 1 allocation and 3.0 MiB per step\n", text)
        self.assertIn("at least 32\n  distinct steps", text)
        # A higher threshold: not growing.
        self.assertEqual(fp.growth_report(1, min_steps=41, as_dict=True)["growing"], 0)
        for p in kept:
            lib.flare_torch_free(p, size, 1, s)
        r = fp.growth_report(1, as_dict=True)
        self.assertFalse([g for g in r["groups"] if g["bytes"] == size], r)
        lib.flare_torch_reset()

    def test_bad_arguments_raise(self):
        with self.assertRaises(fp.FlareError) as e:
            fp.growth_report(5)  # the simulated machine has 2 devices
        self.assertEqual(e.exception.status, "FLARE_STATUS_INVALID_ARGUMENT")
        for bad in ({"step_events": 0}, {"min_steps": 0}):
            with self.assertRaises(ValueError):
                fp.growth_report(0, **bad)
        with self.assertRaises(TypeError):
            fp.growth_report(0, step_events=1.5)


class SleepWake(unittest.TestCase):
    """sleep() / wake() / census() of device 1's tensor memory on the simulated
    driver, whose new physical memory holds stale bytes (0xFF), as a GPU's may."""

    def setUp(self):
        self.lib = fp.load()

    def tearDown(self):
        self.lib.flare_torch_reset()

    def test_a_zeroing_wake_zeroes_what_a_discard_sleep_dropped(self):
        lib = self.lib
        n = 3 * MIB + 100
        pattern = (bytes(range(1, 251)) * (n // 250 + 1))[:n]
        p = lib.flare_torch_alloc(n, 1, None)
        self.assertTrue(p)
        sim_write(lib, 1, p, pattern)
        before = fp.census(1)
        self.assertFalse(before["sleeping"])
        self.assertEqual(before["live_count"], 1)
        fp.sleep("discard", device=1)
        self.assertTrue(fp.census(1)["sleeping"])
        self.assertEqual(fp.census(1)["physical_bytes"], 0)
        fp.wake(zero=True, device=1)
        self.assertEqual(sim_read(lib, 1, p, n), bytes(n), "every requested byte zero")
        c = fp.census(1)
        self.assertFalse(c["sleeping"])
        self.assertEqual(c["zeroed_bytes"] - before["zeroed_bytes"], n)
        self.assertEqual(c["zero_memsets"] - before["zero_memsets"], 1)
        # What it is for: a plain wake after a discard sleep gives stale bytes.
        fp.sleep("discard", device=1)
        fp.wake(device=1)
        self.assertEqual(sim_read(lib, 1, p, n), b"\xff" * n)
        # An offload sleep restores the bytes; zeroing does nothing there.
        sim_write(lib, 1, p, pattern)
        fp.sleep("offload", device=1)
        fp.wake(zero=True, device=1)
        self.assertEqual(sim_read(lib, 1, p, n), pattern)
        self.assertEqual(fp.census(1)["zeroed_bytes"], c["zeroed_bytes"])
        lib.flare_torch_free(p, n, 1, None)
        self.assertEqual(fp.census(1)["live_count"], 0)

    def test_bad_calls_raise_and_change_nothing(self):
        lib = self.lib
        with self.assertRaises(ValueError):
            fp.sleep("bogus", device=1)
        with self.assertRaises(fp.FlareError) as cm:
            fp.wake(device=1)
        self.assertEqual(cm.exception.status, "FLARE_STATUS_TAG_STATE")
        with self.assertRaises(fp.FlareError) as cm:
            fp.wake(zero=True, device=1)
        self.assertEqual(cm.exception.status, "FLARE_STATUS_TAG_STATE")
        for call in (lambda: fp.sleep(device=5), lambda: fp.wake(device=5), lambda: fp.census(5)):
            with self.assertRaises(fp.FlareError) as cm:
                call()
            self.assertEqual(cm.exception.status, "FLARE_STATUS_INVALID_ARGUMENT")
        with self.assertRaises(TypeError):
            fp.wake(zero=True, stream=1.5, device=1)
        p = lib.flare_torch_alloc(MIB, 1, None)
        fp.sleep("discard", device=1)
        # A stream that is not live: refused before anything, still asleep.
        with self.assertRaises(fp.FlareError) as cm:
            fp.wake(zero=True, stream=0xDEAD0000, device=1)
        self.assertEqual(cm.exception.status, "FLARE_STATUS_DRIVER_ERROR")
        self.assertIn("cuStreamGetCaptureInfo", str(cm.exception))
        self.assertTrue(fp.census(1)["sleeping"])
        with self.assertRaises(fp.FlareError) as cm:
            fp.sleep("discard", device=1)
        self.assertEqual(cm.exception.status, "FLARE_STATUS_TAG_STATE")
        s = stream(lib, 1)
        fp.wake(zero=True, stream=s, device=1)
        self.assertEqual(sim_read(lib, 1, p, MIB), bytes(MIB))
        fp._check("complete", lib.flare_torch_sim_stream_complete(1, s))
        lib.flare_torch_free(p, MIB, 1, None)
        self.assertEqual(faults(lib, 1), 0)


if __name__ == "__main__":
    unittest.main()
