"""The model and measurement helpers of run_h200.py (split from it: one concern a
file): a Llama-style model with random weights, its inputs, a part's Result,
driver and PyTorch memory counters, eager runs, graph captures and replays, and the
comparisons the parts make."""

import time
import traceback

SHAPES = [(1, 1), (1, 7), (3, 33), (8, 128), (5, 257)]
GIB = 1 << 30

# ----------------------------------------------------------------------------- model
def build_model(torch, device, blocks=4, hidden=1024, heads=16, kv_heads=4, inter=2816, vocab=8192):
    """A Llama-style decoder (RMSNorm, rotary embeddings, grouped-query SDPA
    attention, SwiGLU MLP), random weights from a fixed seed, bf16."""
    nn, F = torch.nn, torch.nn.functional
    head_dim = hidden // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(v + 1e-5)).to(x.dtype) * self.w

    def rope(x, pos):
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=x.device).float() / head_dim))
        f = pos.float()[:, None] * inv[None, :]
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(hidden, heads * head_dim, bias=False)
            self.kv = nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
            self.o = nn.Linear(hidden, hidden, bias=False)
            self.up = nn.Linear(hidden, 2 * inter, bias=False)
            self.down = nn.Linear(inter, hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, s, heads, head_dim).transpose(1, 2)
            k, v = self.kv(h).view(b, s, 2, kv_heads, head_dim).unbind(2)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            pos = torch.arange(s, device=x.device)
            q, k = rope(q, pos), rope(k, pos)
            rep = heads // kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, hidden))
            g, u = self.up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.norm = RMSNorm()
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    m = Model()  # weights made on the CPU: the same in every process
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.02 + (1.0 if p.dim() == 1 else 0.0))
    return m.to(device=device, dtype=torch.bfloat16).eval()


def inputs(torch, shape, seed, device, vocab=8192):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g).to(device)


# ----------------------------------------------------------------------------- helpers
class Result:
    """A part's results: figures, checks (name -> bool, with a detail) and errors."""

    def __init__(self, name):
        self.d = {"part": name, "checks": {}, "figures": {}, "errors": [], "skipped": None}

    def fig(self, k, v):
        self.d["figures"][k] = v

    def check(self, k, ok, detail=""):
        self.d["checks"][k] = {"ok": bool(ok), "detail": str(detail)}

    def guard(self, name, f):
        """Runs f(); an exception is recorded as a failed check `name`."""
        try:
            return f()
        except Exception as e:  # noqa: BLE001
            self.check(name, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}")
            return None


def driver_used(torch, device=0):
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def torch_counters(torch, device=0):
    out = {}
    for k, f in [
        ("memory_allocated", torch.cuda.memory_allocated),
        ("max_memory_allocated", torch.cuda.max_memory_allocated),
        ("memory_reserved", torch.cuda.memory_reserved),
        ("max_memory_reserved", torch.cuda.max_memory_reserved),
    ]:
        try:
            out[k] = int(f(device))
        except Exception as e:  # noqa: BLE001
            out[k] = f"unsupported: {type(e).__name__}: {str(e)[:120]}"
    return out


# Diagnostics beside each driver-memory sample: (driver used, the allocator's own
# bytes), the allocator's bytes from ALLOCATOR_BYTES (torch's reserved bytes for
# the default allocator, our physical bytes for ours).
ALLOCATOR_BYTES = None
DIAG = []


def sample(torch, device, samples):
    used = driver_used(torch, device)
    samples.append(used)
    if ALLOCATOR_BYTES is not None:
        DIAG.append((used, ALLOCATOR_BYTES(device)))


def run_eager(torch, model, device, samples):
    outs = {}
    with torch.no_grad():
        for i, shape in enumerate(SHAPES):
            outs[str(shape)] = model(inputs(torch, shape, 100 + i, device)).cpu()
            torch.cuda.synchronize(device)
            sample(torch, device, samples)
    return outs


def capture_graphs(torch, model, device, pool=None, vocab=8192):
    """One CUDA graph per shape (side-stream warmup, then capture); returns
    {shape: (graph, static_in, static_out)}."""
    graphs = {}
    with torch.no_grad():
        for i, shape in enumerate(SHAPES):
            static_in = inputs(torch, shape, 100 + i, device, vocab=vocab)
            s = torch.cuda.Stream(device)
            s.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(s):
                for _ in range(2):
                    model(static_in)
            torch.cuda.current_stream(device).wait_stream(s)
            g = torch.cuda.CUDAGraph()
            kw = {"pool": pool} if pool is not None else {}
            with torch.cuda.graph(g, **kw):
                static_out = model(static_in)
            graphs[str(shape)] = (g, static_in, static_out)
    return graphs


def replay_all(torch, graphs, device):
    outs = {}
    for i, (k, (g, static_in, static_out)) in enumerate(graphs.items()):
        shape = tuple(static_in.shape)
        static_in.copy_(inputs(torch, shape, 100 + i, device))
        g.replay()
        torch.cuda.synchronize(device)
        outs[k] = static_out.cpu()
    return outs


def compare(torch, res, name, outs, ref):
    bad = []
    for k, v in ref.items():
        o = outs.get(k)
        if o is None or not torch.equal(o, v):
            diff = None if o is None else (o.float() - v.float()).abs().max().item()
            bad.append(f"{k}: max|diff|={diff}")
    res.check(name, not bad, "; ".join(bad) or f"{len(ref)} shapes bitwise equal")


def aliasing(torch, res, graphs, device, ref_graph):
    """Tensors allocated and filled after the captures, every graph replayed, the
    tensors compared with their saved values."""
    g = torch.Generator(device="cpu").manual_seed(7)
    live = []
    for n in [1, 7, 512, 4096, 65536, 1 << 20, 3 << 20, 17 << 20]:
        t = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int32)
        live.append((t.to(device), t))
    outs = replay_all(torch, graphs, device)
    outs = replay_all(torch, graphs, device)  # twice: every graph ran after the fills
    bad = [i for i, (d, h) in enumerate(live) if not torch.equal(d.cpu(), h)]
    res.check("aliasing: live tensors intact after every replay", not bad, f"corrupted: {bad}" if bad else f"{len(live)} tensors intact")
    compare(torch, res, "graph replay after the aliasing fills == reference", outs, ref_graph)


def decode_loop(torch, model, device, steps=300, reps=5):
    """A decode-like step: batch 4, one token, the model's many small tensors, plus
    64 small scratch tensors; per-step host time (median of reps), ms."""
    ids = inputs(torch, (4, 1), 5, device)
    times = []
    with torch.no_grad():
        for _ in range(30):
            model(ids)
        torch.cuda.synchronize(device)
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(steps):
                model(ids)
                scratch = [torch.empty(64 * (j + 1), device=device) for j in range(64)]
                del scratch
            torch.cuda.synchronize(device)
            times.append((time.perf_counter() - t0) / steps * 1e3)
    times.sort()
    return times[len(times) // 2]


def load_ref(torch, out):
    return torch.load(out / "ref.pt")


# ----------------------------------------------------------------------------- parts
