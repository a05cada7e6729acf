"""CI tests of the workload benchmark's CPU parts (python/bench; no torch, no GPU,
no matplotlib needed): the command line refuses bad workload and allocator names
with a clear message, and the report made from saved JSON aggregates as
docs/workloads.md says (medians, p99, growth, spread, ratio, the equality check,
the targets, two runs merged), on hand-written runs whose expected figures are
worked out here by hand. The largest-size search, the schedule and the children's
environment are checked too.

The package is loaded from python/bench without putting python/ on sys.path (that
would shadow an installed flare_package in the other test modules)."""

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
RUN = BENCH / "run.py"


def load_bench():
    if "bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench", BENCH / "__init__.py", submodule_search_locations=[str(BENCH)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench"] = mod
        spec.loader.exec_module(mod)
    return {n: importlib.import_module(f"bench.{n}") for n in ("config", "cli", "aggregate", "search", "report", "parent", "child")}


B = load_bench()
GIB = 1 << 30
MIB = 1 << 20


def run_cli(*args):
    env = dict(os.environ)
    env.pop("FLARE_PACKAGE_TEST_INSTALLED", None)
    return subprocess.run([sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=120, env=env)


def steps(ms, driver_peak, live, phase="run"):
    return [{"i": i, "phase": phase, "ms": m, "driver": d, "driver_peak": d, "live": lv, "held": 0, "shape": {}}
            for i, (m, d, lv) in enumerate(zip(ms, driver_peak, live))]


def make_run(workload, allocator, rnd, ms, peak, hashes, driver_series=None, live_series=None, budget=None, source=None):
    n = len(ms)
    r = {
        "run_id": f"{workload}.{allocator}.r{rnd}",
        "workload": workload,
        "allocator": allocator,
        "round": rnd,
        "status": "ok",
        "env": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.x"},
        "steps": steps(ms, driver_series or [peak] * n, live_series or [GIB] * n),
        "outputs": {"kind": "loss per step", "hashes": hashes, "values": []},
        "figures": {"driver_peak_bytes": peak, "driver_peak_step_bytes": peak,
                    "allocator_peak": {"bytes": peak - MIB, "source": "test"},
                    "driver_after_bytes": peak // 2, "driver_after_empty_cache_bytes": peak // 4},
    }
    if budget is not None:
        r["figures"]["budget"] = {"largest": budget, "param": "seq_len", "budget_bytes": 10 * GIB, "fixed_bytes": 8 * GIB, "headroom_bytes": 2 * GIB}
    if source:
        r["source"] = source
    return r


class CommandLine(unittest.TestCase):
    def test_unknown_workload_is_refused_with_the_known_ones(self):
        with tempfile.TemporaryDirectory() as d:
            p = run_cli(d, "--workloads", "serving,inference")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("unknown workload 'inference': choose from serving, graphs, training", p.stderr)

    def test_unknown_allocator_is_refused_with_the_known_ones(self):
        with tempfile.TemporaryDirectory() as d:
            p = run_cli(d, "--allocators", "default,caching,flare")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("unknown allocator 'caching': choose from default, expandable, flare, flare-mempool", p.stderr)
        # Nothing ran: no results were written.
        self.assertFalse((pathlib.Path(d) / "results.json").exists())

    def test_parse_defaults_and_normalisation(self):
        a = B["cli"].parse(["out"])
        self.assertEqual(a.workloads, ["serving", "graphs", "training"])
        self.assertEqual(a.allocators, ["default", "expandable", "flare", "flare-mempool"])
        self.assertEqual(a.rounds, 1)
        a = B["cli"].parse(["out", "--workloads", " training, serving,training ", "--allocators", "flare,default"])
        self.assertEqual(a.workloads, ["training", "serving"])
        self.assertEqual(a.allocators, ["flare", "default"])

    def test_bad_combinations_are_refused(self):
        U = B["cli"].UsageError
        for argv, words in [
            (["out", "--workloads", ""], "no workload given"),
            (["out", "--allocators", "flare+retention"], "unknown allocator 'flare+retention'"),
            (["out", "--rounds", "0"], "--rounds must be at least 1"),
            (["out", "--quick", "--tiny"], "choose one"),
            (["a", "b"], "one OUTDIR expected, got 2"),
            ([], "one OUTDIR expected, got 0"),
            (["out", "--into", "x"], "--into goes with --report"),
            (["--report"], "--report needs at least one OUTDIR"),
            (["--report", "/nonexistent/bench-out"], "no such directory: /nonexistent/bench-out"),
        ]:
            with self.subTest(argv=argv):
                with self.assertRaises(U) as cm:
                    B["cli"].parse(argv)
                self.assertIn(words, str(cm.exception))


class Statistics(unittest.TestCase):
    def test_median_and_p99(self):
        A = B["aggregate"]
        self.assertEqual(A.median([5, 1, 3]), 3)
        self.assertEqual(A.median([4, 1, 3, 2]), 2.5)
        self.assertIsNone(A.median([]))
        # Nearest rank: the ceil(0.99 * 200) = 198th smallest of 1..200.
        self.assertEqual(A.p99(list(range(200, 0, -1))), 198)
        # 50 values: ceil(49.5) = 50th: the largest.
        self.assertEqual(A.p99(list(range(1, 51))), 50)
        self.assertEqual(A.p99([7]), 7)

    def test_growth(self):
        A = B["aggregate"]
        # First half [1, 5, 2] (max 5), second half [3, 9, 4] (max 9).
        self.assertEqual(A.growth([1, 5, 2, 3, 9, 4]), 4)
        # Odd length: the second half starts at n // 2 = 2: [2, 1, 1] vs [3, 3].
        self.assertEqual(A.growth([3, 3, 2, 1, 1]), -1)
        self.assertIsNone(A.growth([1]))

    def test_run_figures_use_the_run_phase_only(self):
        A = B["aggregate"]
        r = make_run("graphs", "default", 0, [2.0, 4.0, 3.0, 100.0], 5 * GIB, ["a"] * 4,
                     driver_series=[1, 2, 3, 10], live_series=[5, 5, 5, 5])
        # A capture step in front: not a timed step, not in the growth.
        r["steps"] = steps([500.0], [999], [0], phase="capture") + r["steps"]
        f = A.run_figures(r)
        self.assertEqual(f["steps"], 4)
        self.assertEqual(f["median_ms"], 3.5)
        self.assertEqual(f["p99_ms"], 100.0)
        self.assertEqual(f["growth_driver_bytes"], 10 - 2)
        self.assertEqual(f["growth_driver_peak_bytes"], 10 - 2)
        self.assertEqual(f["growth_live_bytes"], 0)


    def test_growth_target_figure_is_the_end_of_step_memory(self):
        A = B["aggregate"]
        r = make_run("serving", "default", 0, [1.0] * 4, GIB, ["a"] * 4)
        # Held between steps: 1, 1, 3, 3 (grows by 2); peaks: 9, 5, 6, 6 (the
        # largest call came first: the peak series "shrinks" by 3).
        for s, end, peak in zip(r["steps"], [1, 1, 3, 3], [9, 5, 6, 6]):
            s["driver"], s["driver_peak"] = end, peak
        f = A.run_figures(r)
        self.assertEqual(f["growth_driver_bytes"], 2)
        self.assertEqual(f["growth_driver_peak_bytes"], -3)


class Summary(unittest.TestCase):
    def runs(self):
        # default: rounds with medians 10 and 12 (steps 9,10,11 / 11,12,13).
        # flare: rounds with medians 10.1 and 10.3; peak below both PyTorch ones.
        # expandable: one round, median 20, lowest PyTorch peak 6 GiB.
        h = ["h1", "h2", "h3"]
        return [
            make_run("training", "default", 0, [9.0, 10.0, 11.0], 8 * GIB, h, budget=1024),
            make_run("training", "default", 1, [11.0, 12.0, 13.0], 8 * GIB, h),
            make_run("training", "expandable", 0, [20.0, 20.0, 20.0], 6 * GIB, h, budget=1536),
            make_run("training", "flare", 0, [10.1, 10.1, 10.1], 5 * GIB, h, budget=2048),
            make_run("training", "flare", 1, [10.3, 10.3, 10.3], 5 * GIB, ["h1", "XX", "h3"]),
        ]

    def test_medians_spread_ratio(self):
        s = B["aggregate"].summarize(self.runs())["training"]["allocators"]
        d, f, e = s["default"], s["flare"], s["expandable"]
        self.assertEqual(d["median_ms"], 11.0)  # median of 10 and 12
        self.assertAlmostEqual(d["spread"], 2 / 11)
        self.assertAlmostEqual(f["median_ms"], 10.2)
        self.assertAlmostEqual(f["spread"], 0.2 / 10.2)
        self.assertAlmostEqual(f["ratio_to_default"], 10.2 / 11)
        self.assertIsNone(e["spread"])  # one round
        self.assertAlmostEqual(e["ratio_to_default"], 20 / 11)
        # p99 per run is the largest of 3 steps; median over rounds: (11 + 13) / 2.
        self.assertEqual(d["p99_ms"], 12.0)
        self.assertEqual(f["budget_largest"], 2048)
        self.assertEqual(d["budget_largest"], 1024)

    def test_equality_flags_the_differing_step(self):
        w = B["aggregate"].summarize(self.runs())["training"]
        self.assertEqual(w["reference"], "training.default.r0")
        f = w["allocators"]["flare"]
        self.assertFalse(f["outputs_equal"])
        self.assertTrue(f["outputs"]["training.flare.r0"]["equal"])
        bad = f["outputs"]["training.flare.r1"]
        self.assertEqual((bad["differ"], bad["differ_count"], bad["steps"]), ([1], 1, 3))
        self.assertTrue(w["allocators"]["default"]["outputs_equal"])
        t = w["targets"]["flare"]
        self.assertEqual(t["outputs"]["state"], "misses")
        self.assertIn("training.flare.r1: 1 of 3 steps differ (first: [1])", t["outputs"]["detail"])

    def test_length_mismatch_is_a_difference(self):
        A = B["aggregate"]
        c = A.compare_outputs({"outputs": {"hashes": ["a", "b"]}}, {"outputs": {"hashes": ["a", "b", "c"]}})
        self.assertFalse(c["equal"])
        self.assertEqual(c["length"], [2, 3])

    def test_targets(self):
        t = B["aggregate"].summarize(self.runs())["training"]["targets"]["flare"]
        # 5 GiB <= min(8, 6) GiB.
        self.assertEqual(t["memory"]["state"], "holds")
        self.assertIn("-16.7%", t["memory"]["detail"])
        # 10.2 / 11 = 0.927 <= 1.02; |0.073| is below the default's spread 18.2%.
        self.assertEqual(t["time"]["state"], "holds")
        self.assertIn("not established", t["time"]["detail"])
        self.assertEqual(t["growth"]["state"], "holds")

    def test_memory_and_time_misses(self):
        runs = self.runs()
        runs[3] = make_run("training", "flare", 0, [13.0] * 3, 7 * GIB, ["h1", "h2", "h3"])
        runs[4] = make_run("training", "flare", 1, [13.0] * 3, 7 * GIB, ["h1", "h2", "h3"])
        t = B["aggregate"].summarize(runs)["training"]["targets"]["flare"]
        self.assertEqual(t["memory"]["state"], "misses")  # 7 GiB > 6 GiB (expandable)
        self.assertEqual(t["time"]["state"], "misses")  # 13 / 11 = 1.18
        self.assertEqual(t["outputs"]["state"], "holds")

    def test_growth_target(self):
        # Driver memory grows by 100 MiB over the run while live bytes stay flat.
        n = 10
        drv = [GIB] * 5 + [GIB + 100 * MIB] * 5
        runs = [make_run("serving", "default", 0, [1.0] * n, 2 * GIB, ["h"] * n),
                make_run("serving", "expandable", 0, [1.0] * n, 2 * GIB, ["h"] * n),
                make_run("serving", "flare", 0, [1.0] * n, GIB + 100 * MIB, ["h"] * n, driver_series=drv)]
        t = B["aggregate"].summarize(runs)["serving"]["targets"]["flare"]
        self.assertEqual(t["growth"]["state"], "misses")
        self.assertEqual(t["time"]["state"], "holds")
        self.assertIn("one round each", t["time"]["detail"])

    def test_missing_pytorch_peak_is_unknown(self):
        runs = [r for r in self.runs() if r["allocator"] != "expandable"]
        t = B["aggregate"].summarize(runs)["training"]["targets"]["flare"]
        self.assertEqual(t["memory"]["state"], "unknown")


class ReportFromSavedJson(unittest.TestCase):
    def write_dir(self, root, name, runs, meta):
        d = pathlib.Path(root) / name
        (d / "runs").mkdir(parents=True)
        for r in runs:
            (d / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
        (d / "meta.json").write_text(json.dumps(meta))
        return d

    def test_two_calls_merge_into_one_report(self):
        h = ["a", "b", "c", "d"]
        call1 = [make_run("serving", "default", 0, [30.0, 31.0, 32.0, 33.0], 4 * GIB, h),
                 make_run("serving", "expandable", 0, [30.0] * 4, 3 * GIB, h),
                 make_run("serving", "flare", 0, [31.0] * 4, 3 * GIB + 512 * MIB, h)]
        failed = {"run_id": "serving.flare-mempool.r0", "workload": "serving", "allocator": "flare-mempool", "round": 0,
                  "status": "failed", "error": "RuntimeError: boom", "stderr_tail": "Traceback...\nRuntimeError: boom", "rc": 1}
        call2 = [make_run("training", "default", 0, [100.0] * 4, 20 * GIB, h),
                 make_run("training", "expandable", 0, [101.0] * 4, 19 * GIB, h),
                 make_run("training", "flare", 0, [99.0] * 4, 18 * GIB, ["a", "b", "c", "z"])]
        with tempfile.TemporaryDirectory() as root:
            d1 = self.write_dir(root, "call1", call1 + [failed], {"size": "full", "rounds": 1, "workloads": ["serving"], "allocators": ["default"]})
            d2 = self.write_dir(root, "call2", call2, {"size": "full", "rounds": 1, "workloads": ["training"], "allocators": ["default"]})
            into = pathlib.Path(root) / "merged"
            p = run_cli("--report", str(d1), str(d2), "--into", str(into))
            self.assertEqual(p.returncode, 0, p.stderr)
            res = json.loads((into / "results.json").read_text())
            md = (into / "report.md").read_text()
        s = res["summary"]
        self.assertEqual(sorted(s), ["serving", "training"])
        self.assertEqual(len(res["runs"]), 7)
        self.assertEqual(sorted(m["source"] for m in res["sources"]), ["call1", "call2"])
        self.assertEqual(s["serving"]["allocators"]["default"]["median_ms"], 31.5)
        self.assertEqual(s["serving"]["allocators"]["flare-mempool"]["failed"], ["serving.flare-mempool.r0"])
        # 3.5 GiB > 3 GiB: a miss, and the report says so.
        self.assertEqual(s["serving"]["targets"]["flare"]["memory"]["state"], "misses")
        self.assertEqual(s["training"]["targets"]["flare"]["memory"]["state"], "holds")
        self.assertEqual(s["training"]["allocators"]["flare"]["outputs"]["training.flare.r0"]["differ"], [3])
        self.assertIn("- flare, memory: **MISSES**", md)
        self.assertIn("- flare, outputs: **MISSES**: training.flare.r0: 1 of 4 steps differ (first: [3])", md)
        self.assertIn("`serving.flare-mempool.r0` failed", md)
        self.assertEqual(s["serving"]["targets"]["flare-mempool"]["run"]["state"], "misses")
        self.assertIn("- flare-mempool, run: **MISSES**: no run finished: serving.flare-mempool.r0 failed", md)
        self.assertIn("RuntimeError: boom", md)
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            self.assertIn("(no picture: matplotlib not available", md)


class ParentWithoutChildren(unittest.TestCase):
    def test_skipped_runs_are_reported_and_runs_dir_is_honoured(self):
        # On the CPU the flare allocators are skipped, and flare-mempool does not
        # run training: the parent starts no child (no torch needed) and still
        # writes its results and report.
        with tempfile.TemporaryDirectory() as root:
            out, runs = pathlib.Path(root) / "out", pathlib.Path(root) / "runs"
            p = run_cli(str(out), "--device", "cpu", "--workloads", "training", "--allocators", "flare,flare-mempool",
                        "--runs-dir", str(runs))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("(1/2) training / flare / round 0: SKIPPED: skipped on the CPU", p.stdout)
            self.assertEqual(sorted(f.name for f in runs.iterdir()), ["training.flare-mempool.r0.json", "training.flare.r0.json"])
            self.assertEqual(sorted(f.name for f in out.iterdir()), ["meta.json", "report.md", "results.json"])
            res = json.loads((out / "results.json").read_text())
            self.assertEqual(sorted(r["status"] for r in res["runs"]), ["skipped", "skipped"])
            md = (out / "report.md").read_text()
            self.assertIn("backward runs on autograd's device thread", md)
            # The report re-made from results.json alone (no runs/ beside it).
            p = run_cli("--report", str(out))
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(len(json.loads((out / "results.json").read_text())["runs"]), 2)


class Search(unittest.TestCase):
    def search(self, limit_fits, start, limit, step, max_probes):
        seen = []

        def fits(n):
            seen.append(n)
            return n <= limit_fits

        best, probes, exact = B["search"].largest_fitting(fits, start, limit, step, max_probes)
        self.assertEqual([p[0] for p in probes], seen)
        return best, seen, exact

    def test_doubling_then_bisection(self):
        # 1024, 2048, 4096 fit, 8192 fails; bisection in (4096, 8192) by 64:
        # 6144 no, 5120 no, 4608 yes, 4864 yes, 4992 yes, 5056 no: 4992 (5000 // 64 * 64).
        best, seen, exact = self.search(5000, 1024, 65536, 64, 20)
        self.assertEqual(best, 4992)
        self.assertEqual(seen, [1024, 2048, 4096, 8192, 6144, 5120, 4608, 4864, 4992, 5056])
        self.assertTrue(exact)

    def test_first_probe_fails(self):
        best, seen, exact = self.search(100, 1024, 65536, 64, 20)
        self.assertEqual(best, 64)
        self.assertEqual(seen[0], 1024)
        self.assertTrue(exact)

    def test_nothing_fits(self):
        best, seen, exact = self.search(10, 128, 1024, 64, 20)
        self.assertEqual((best, seen, exact), (0, [128, 64], True))

    def test_limit_and_probe_cap(self):
        self.assertEqual(self.search(10**9, 1024, 4096, 64, 20), (4096, [1024, 2048, 4096], True))
        best, seen, exact = self.search(5000, 1024, 65536, 64, 5)
        self.assertEqual(len(seen), 5)
        self.assertEqual(best, 4096)  # 1024, 2048, 4096 yes, 8192 no, 6144 no
        self.assertFalse(exact)

    def test_bad_range(self):
        with self.assertRaises(ValueError):
            B["search"].largest_fitting(lambda n: True, 0, 10, 1, 3)


class Plan(unittest.TestCase):
    def test_alternating_rounds_and_the_retention_variant(self):
        plan = B["parent"].schedule(["graphs"], ["default", "flare"], 2)
        self.assertEqual(plan, [
            ("graphs", "default", 0), ("graphs", "flare", 0), ("graphs", "flare+retention", 0),
            ("graphs", "flare+retention", 1), ("graphs", "flare", 1), ("graphs", "default", 1),
        ])
        self.assertEqual(B["parent"].schedule(["serving"], ["flare", "flare-mempool"], 1),
                         [("serving", "flare", 0), ("serving", "flare-mempool", 0)])

    def test_child_environment(self):
        P = B["parent"]
        old = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "garbage_collection_threshold:0.5"
        try:
            self.assertEqual(P.child_env("expandable", "cuda")["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True")
            for a in ("default", "flare", "flare-mempool", "flare+retention"):
                self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", P.child_env(a, "cuda"))
            self.assertEqual(P.child_env("default", "cuda")["CUBLAS_WORKSPACE_CONFIG"], ":4096:8")
        finally:
            if old is None:
                os.environ.pop("PYTORCH_CUDA_ALLOC_CONF")
            else:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = old

    def test_output_digest_is_exact(self):
        C = B["child"]
        self.assertNotEqual(C.digest(0.1), C.digest(0.1 + 2**-56))
        self.assertEqual(C.digest([[1, 2], [3, 4]]), C.digest([[1, 2], [3, 4]]))
        self.assertNotEqual(C.digest([[1, 2], [3, 4]]), C.digest([[1, 2], [3, 5]]))


FLARE_VIEW = r"""
import json, sys, types
sys.path.insert(0, sys.argv[1])
import flare_package as fp
fp.use_simulated(1 << 30, 1)
lib = fp.load()
from bench.memory import AllocatorView
v = AllocatorView(None, "flare", types.SimpleNamespace(type="cuda", index=0))
p = lib.flare_torch_alloc(3 << 20, 0, None)
q = lib.flare_torch_alloc(1000, 0, None)
a = (v.live(), v.held(), v.peak())
lib.flare_torch_free(p, 3 << 20, 0, None)
b = (v.live(), v.held(), v.peak())
print(json.dumps({"a": a, "b": b, "details": v.details()}))
"""


class FlareCounters(unittest.TestCase):
    """The benchmark's reading of flare_package.stats() (live, held, peak), on the
    simulated driver, in a process of its own (use_simulated must come before any
    allocation of the process). Skipped when the library is not built."""

    def test_stats_keys_the_benchmark_reads(self):
        python = str(BENCH.parent)
        env = dict(os.environ)
        probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import flare_package as fp; print(fp.library_path())", python],
                               capture_output=True, text=True, env=env, timeout=60)
        if probe.returncode != 0:
            self.skipTest(f"flare_package's library not found: {probe.stderr.strip().splitlines()[-1:]}")
        p = subprocess.run([sys.executable, "-c", FLARE_VIEW, python], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        (live, held, peak), (live2, held2, peak2) = out["a"], out["b"]
        self.assertEqual(live, (3 << 20) + 1000)  # live_requested_bytes: as asked, not rounded
        self.assertGreaterEqual(held, (3 << 20) + 1000)
        self.assertEqual(peak["bytes"], held)
        self.assertEqual(peak["pools"]["graph_pools"], [])
        self.assertEqual(live2, 1000)
        self.assertGreaterEqual(peak2["bytes"], held2)
        self.assertEqual(out["details"]["hook_failures"], 0)
        self.assertIn("live_requested_bytes", out["details"]["tensor"])


if __name__ == "__main__":
    unittest.main()
