"""The model: a Llama-style decoder built by ``transformers`` from a LlamaConfig,
random weights from a fixed seed (no download), and its decode step for CUDA
graphs with a static KV cache shared by every captured batch size (as vLLM and
SGLang keep one KV cache for all their graphs).

Why a decode step of our own rather than transformers' StaticCache: a StaticCache
holds one cache per batch size (its batch dimension is fixed), so 35 captured
batch sizes would need 35 caches (about 75 GB at 1024 tokens for 1..256), and
whether transformers' forward with it captures without a host synchronisation
depends on the transformers version. The step here calls the model's own modules
(embed_tokens, each layer's input_layernorm, q/k/v/o_proj, post_attention_layernorm
and mlp, the final norm and lm_head), the rotary embedding from the model's
inv_freq, and scaled_dot_product_attention over the shared cache; ``check_decode``
compares it with transformers' forward (the CPU smoke test runs it)."""

import os


def llama_config(size_cfg, max_positions):
    from transformers import LlamaConfig  # noqa: PLC0415

    c = size_cfg
    return LlamaConfig(
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        vocab_size=c["vocab"],
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        attn_implementation="sdpa",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )


def build(torch, size_cfg, device, dtype, seed, max_positions=131072):
    """A LlamaForCausalLM made directly on ``device`` in ``dtype`` (weights drawn
    there from ``seed``: the same in every process), in eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    cfg = llama_config(size_cfg, max_positions)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    # No .to(dtype) afterwards: the rotary embedding's inv_freq stays float32, as
    # from_pretrained(torch_dtype=...) leaves it.
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    gc.bos_token_id = None
    gc.do_sample = False
    return model.eval()


def describe(model):
    """Parameter count, bytes and the attention implementation, for the record."""
    n = sum(p.numel() for p in model.parameters())
    b = sum(p.numel() * p.element_size() for p in model.parameters())
    impl = getattr(model.config, "_attn_implementation", None)
    return {"parameters": n, "parameter_bytes": b, "attn_implementation": impl}


def parameter_count(size_cfg):
    """Parameters of the model of ``size_cfg`` (untied head, no biases), computed."""
    c = size_cfg
    hd = c["hidden"] // c["heads"]
    attn = c["hidden"] * c["heads"] * hd * 2 + c["hidden"] * c["kv_heads"] * hd * 2
    layer = attn + 3 * c["hidden"] * c["inter"] + 2 * c["hidden"]
    return 2 * c["vocab"] * c["hidden"] + c["layers"] * layer + c["hidden"]


class DecodeStep:
    """One decode step of ``model`` for a batch of ``b`` sequences all at the same
    position: ``step(ids [b, 1] int64, pos [1] int64) -> next ids [b]`` (greedy).
    The KV cache ``kv`` [layers, 2, max_batch, kv_heads, ctx, head_dim] is made once
    (zeros) and shared by every batch size: a batch of b uses rows 0..b-1. No host
    synchronisation, no allocation outside the step: capturable in a CUDA graph."""

    def __init__(self, torch, model, max_batch, ctx):
        self.torch, self.model = torch, model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.ctx = ctx
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.kv = torch.zeros(
            (cfg.num_hidden_layers, 2, max_batch, self.kv_heads, ctx, self.head_dim), dtype=self.dtype, device=self.device
        )
        rot = model.model.rotary_emb
        self.inv_freq = rot.inv_freq.to(device=self.device, dtype=torch.float32)
        self.scaling = float(getattr(rot, "attention_scaling", 1.0))
        self.arange = torch.arange(ctx, device=self.device)

    def cache_bytes(self):
        return self.kv.numel() * self.kv.element_size()

    def _rotate(self, x, cos, sin):
        half = x.shape[-1] // 2
        rot = self.torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def logits(self, ids, pos):
        torch = self.torch
        m = self.model.model
        b = ids.shape[0]
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        rep = h // kvh
        x = m.embed_tokens(ids)  # [b, 1, hidden]
        f = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [1, hd/2]
        emb = torch.cat((f, f), dim=-1)
        cos = (emb.cos() * self.scaling).to(self.dtype)[:, None, None, :]  # [1, 1, 1, hd]
        sin = (emb.sin() * self.scaling).to(self.dtype)[:, None, None, :]
        mask = (self.arange <= pos)[None, None, None, :]  # [1, 1, 1, ctx]: positions up to pos
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            y = layer.input_layernorm(x)
            q = a.q_proj(y).view(b, 1, h, hd).transpose(1, 2)  # [b, h, 1, hd]
            k = a.k_proj(y).view(b, 1, kvh, hd).transpose(1, 2)  # [b, kvh, 1, hd]
            v = a.v_proj(y).view(b, 1, kvh, hd).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            kc, vc = self.kv[i, 0, :b], self.kv[i, 1, :b]  # [b, kvh, ctx, hd], views
            # One position per row, each written once: the result is the same
            # whatever the order, so the plain kernel is used (deterministic mode
            # would route index_copy_ through a sort-based index_put_).
            det = torch.are_deterministic_algorithms_enabled()
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
            torch.use_deterministic_algorithms(False)
            try:
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v)
            finally:
                torch.use_deterministic_algorithms(det, warn_only=warn_only)
            # Grouped-query attention with one query token: the rep query heads of
            # a KV head are its rep "query positions" (query head j uses KV head
            # j // rep, as transformers' repeat_kv does).
            qg = q.reshape(b, kvh, rep, hd)
            o = torch.nn.functional.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)
            x = x + a.o_proj(o.reshape(b, 1, h * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(m.norm(x))[:, -1, :]

    def __call__(self, ids, pos):
        return self.logits(ids, pos).argmax(dim=-1)


def check_decode(torch, model, steps=6, batch=2, seed=5):
    """Feeds ``steps`` tokens one at a time through a DecodeStep and compares each
    step's logits with transformers' forward of the whole prefix (no cache):
    returns the largest absolute difference (float32 on the CPU: ~1e-6)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    p = next(model.parameters())
    ids = torch.randint(0, vocab, (batch, steps), generator=g).to(p.device)
    dec = DecodeStep(torch, model, batch, steps + 2)
    worst = 0.0
    with torch.no_grad():
        for t in range(steps):
            pos = torch.tensor([t], device=p.device)
            got = dec.logits(ids[:, t : t + 1], pos).float()
            want = model(input_ids=ids[:, : t + 1], use_cache=False).logits[:, -1, :].float()
            worst = max(worst, (got - want).abs().max().item())
    return worst
