"""The three workloads (issue 39), each as ``setup()`` (the model and what stays),
``run()`` (the measured steps, through the child's recorder), ``fixed_bytes()``
(what the budget is set above: config-derived, the same for every allocator) and
``probe(n)`` (one step at size n, for the largest-size search under the budget).

- serving: ``generate`` (greedy, a DynamicCache) on ``calls`` calls whose batch
  size and prompt length change on every call (a seeded draw: batch uniform,
  prompt length log-uniform), ``new_tokens`` new tokens each; outputs: the new
  tokens of every call. Probe: prompt length at a fixed batch.
- graphs: the decode step (model.DecodeStep: one token per sequence, a static KV
  cache shared by all batch sizes) warmed up and captured for every batch size,
  largest first, into ONE graph pool (torch.cuda.graph_pool_handle(); the flare
  MemPool's id for flare-mempool), with a retention scope around the warm-up and
  captures for the flare+retention variant; then ``replays`` replays in a seeded
  mixed order; outputs: the next tokens of every replay. Probe: the batch size of
  one more decode graph (with a KV cache of its own of ``probe_ctx`` tokens)
  captured into the same pool.
- training: forward, backward and AdamW (PyTorch's default implementation:
  foreach) on float32 parameters under torch.autocast(bfloat16), ``steps`` steps
  of a fixed batch whose sequence length is drawn per step (log-uniform);
  gradients set to None after each step; outputs: the loss of every step. Probe:
  sequence length at a fixed batch."""

import contextlib
import math
import random

from . import model as M


def is_oom(torch, e):
    """Whether an exception is an allocation failure (PyTorch's OutOfMemoryError,
    flare's failed request, cuBLAS unable to get its workspace)."""
    if isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        k in text for k in ("out of memory", "request of", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY")
    )


def log_uniform_int(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


class Workload:
    def __init__(self, ctx):
        self.ctx = ctx
        self.torch = ctx.torch
        self.dev = ctx.device
        self.cfg = ctx.workload_cfg
        self.model_cfg = ctx.model_cfg
        self.seed = ctx.seed

    def ids(self, shape, seed):
        """Token ids drawn on the CPU from ``seed`` (the same in every process),
        then copied to the device."""
        g = self.torch.Generator().manual_seed(seed)
        return self.torch.randint(0, self.model_cfg["vocab"], shape, generator=g).to(self.dev)

    def probe(self, n):
        """Runs one step at size n; True if it fitted, False on an out-of-memory."""
        torch = self.torch
        try:
            self.probe_step(n)
            if self.ctx.cuda:
                torch.cuda.synchronize(self.dev)
            return True
        except Exception as e:  # noqa: BLE001
            if not is_oom(torch, e):
                raise
            return False
        finally:
            import gc  # noqa: PLC0415

            gc.collect()


class Serving(Workload):
    name = "serving"

    def setup(self):
        torch = self.torch
        self.model = M.build(torch, self.model_cfg, self.dev, torch.bfloat16, self.seed)
        rng = random.Random(self.seed)
        c = self.cfg
        self.calls = [(rng.randint(*c["batch"]), log_uniform_int(rng, *c["prompt"])) for _ in range(c["calls"])]
        return M.describe(self.model)

    def fixed_bytes(self):
        return M.parameter_count(self.model_cfg) * 2

    def generate(self, batch, length, seed):
        ids = self.ids((batch, length), seed)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=self.torch.ones_like(ids),
            max_new_tokens=self.cfg["new_tokens"],
            do_sample=False,
            pad_token_id=0,
        )
        return out[:, length:].cpu()

    def run(self, rec):
        for i, (b, n) in enumerate(self.calls):
            rec.step("run", lambda b=b, n=n, i=i: self.generate(b, n, self.seed * 100003 + i), {"batch": b, "prompt": n},
                     output=lambda t: t.tolist())

    def probe_step(self, n):
        self.generate(self.cfg["probe_batch"], n, 7)


class Graphs(Workload):
    name = "graphs"

    def setup(self):
        torch = self.torch
        self.model = M.build(torch, self.model_cfg, self.dev, torch.bfloat16, self.seed)
        c = self.cfg
        self.batches = sorted(c["batches"], reverse=True)  # largest first, as vLLM captures
        self.dec = M.DecodeStep(torch, self.model, max(self.batches), c["ctx"])
        rng = random.Random(self.seed)
        self.order = [rng.choice(self.batches) for _ in range(c["replays"])]
        self.graphs = {}
        self.capture = self.ctx.cuda
        if self.capture:
            self.side = torch.cuda.Stream(self.dev)
        d = M.describe(self.model)
        d["decode_step"] = "bench.model.DecodeStep: a static KV cache shared by every batch size (not transformers' StaticCache)"
        d["kv_cache_bytes"] = self.dec.cache_bytes()
        return d

    def kv_bytes(self, batch, ctx):
        m = self.model_cfg
        return m["layers"] * 2 * batch * m["kv_heads"] * ctx * (m["hidden"] // m["heads"]) * 2

    def fixed_bytes(self):
        return M.parameter_count(self.model_cfg) * 2 + self.kv_bytes(max(self.cfg["batches"]), self.cfg["ctx"])

    def pool(self):
        if self.ctx.flare_pool is not None:
            return self.ctx.flare_pool.id
        if not hasattr(self, "_pool"):
            self._pool = self.torch.cuda.graph_pool_handle()
        return self._pool

    def capture_one(self, dec, b, pos_value=0):
        """Warms the step up twice on a side stream, then captures it into the
        shared pool; returns (graph, static ids, static pos, static out). On the
        CPU: no graph (graph None), the warm-up only."""
        torch = self.torch
        ids = torch.zeros((b, 1), dtype=torch.long, device=self.dev)
        pos = torch.full((1,), pos_value, dtype=torch.long, device=self.dev)
        with torch.no_grad():
            if not self.capture:
                dec(ids, pos)
                return None, ids, pos, None
            self.side.wait_stream(torch.cuda.current_stream(self.dev))
            with torch.cuda.stream(self.side):
                for _ in range(2):
                    dec(ids, pos)
            torch.cuda.current_stream(self.dev).wait_stream(self.side)
            g = torch.cuda.CUDAGraph()
            with self.ctx.sampler.paused():
                with torch.cuda.graph(g, pool=self.pool()):
                    out = dec(ids, pos)
        return g, ids, pos, out

    def run(self, rec):
        torch = self.torch
        scope = contextlib.nullcontext()
        if self.ctx.variant == "flare+retention":
            scope = self.ctx.fp.retention()
        t0 = rec.now()
        with scope:
            for b in self.batches:
                def cap(b=b):
                    self.graphs[b] = self.capture_one(self.dec, b)
                rec.step("capture", cap, {"batch": b})
        rec.phase("warmup_capture_s", rec.now() - t0)
        g = torch.Generator().manual_seed(self.seed + 1)
        ctx_len = self.cfg["ctx"]
        for r, b in enumerate(self.order):
            host = torch.randint(0, self.model_cfg["vocab"], (b, 1), generator=g)
            pos = r % ctx_len

            def replay(b=b, host=host, pos=pos):
                graph, ids, p, out = self.graphs[b]
                ids.copy_(host)
                p.fill_(pos)
                if graph is None:  # the CPU: the step itself
                    with torch.no_grad():
                        out = self.dec(ids, p)
                else:
                    graph.replay()
                return out.cpu()

            rec.step("run", replay, {"batch": b}, output=lambda t: t.tolist())

    def probe_step(self, n):
        # Its cache and graph are dropped on return (or with the exception).
        dec = M.DecodeStep(self.torch, self.model, n, self.cfg["probe_ctx"])
        graph = self.capture_one(dec, n)[0]
        if graph is not None:
            graph.replay()


class Training(Workload):
    name = "training"

    def setup(self):
        torch = self.torch
        self.model = M.build(torch, self.model_cfg, self.dev, torch.float32, self.seed)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg["lr"])
        rng = random.Random(self.seed)
        self.lengths = [log_uniform_int(rng, *self.cfg["seq"]) for _ in range(self.cfg["steps"])]
        d = M.describe(self.model)
        d["optimizer"] = "torch.optim.AdamW (default implementation), float32 master weights, torch.autocast(bfloat16)"
        return d

    def fixed_bytes(self):
        # float32 weights, gradients and AdamW's two moments.
        return M.parameter_count(self.model_cfg) * 16

    def train_step(self, batch, length, seed):
        torch = self.torch
        ids = self.ids((batch, length), seed)
        with torch.autocast(device_type=self.dev.type, dtype=torch.bfloat16):
            loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach().float().item()

    def run(self, rec):
        b = self.cfg["batch"]
        for i, n in enumerate(self.lengths):
            rec.step("run", lambda n=n, i=i: self.train_step(b, n, self.seed * 100003 + i), {"batch": b, "seq": n},
                     output=lambda v: v)

    def probe_step(self, n):
        self.opt.zero_grad(set_to_none=True)  # a probe that failed in backward left some
        self.train_step(self.cfg["probe_batch"], n, 11)


WORKLOAD_CLASSES = {"serving": Serving, "graphs": Graphs, "training": Training}
