#!/usr/bin/env python3
"""Records PyTorch memory snapshots of a small Llama-style model on a GPU, for
flare-replay's import of PyTorch snapshots (issue 17): one eager run and one run that
captures and replays CUDA graphs, each in its own process state (the caching
allocator is reset between them by running each mode in a fresh process).

    python3 scripts/torch-snapshot.py eager  OUT_DIR
    python3 scripts/torch-snapshot.py graphs OUT_DIR

Writes OUT_DIR/torch-MODE.pickle (torch.cuda.memory._dump_snapshot) and
OUT_DIR/torch-MODE.json: the torch version, torch.cuda.max_memory_allocated() and
max_memory_reserved() of the same run, and the snapshot's event counts. Recording
starts before anything is allocated on the device, so the allocation trace covers
every allocation of the run and its peak of live bytes is max_memory_allocated.
The model is random (fixed seeds, no download) and small, so each snapshot has a few
thousand events.
"""
import json
import os
import pickle
import sys

import torch


def model_and_inputs():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    shapes = [(1, 7), (2, 16), (3, 33), (4, 64)]
    return model, shapes


def run_eager(model, shapes):
    with torch.no_grad():
        for b, s in shapes:
            ids = torch.randint(0, 1024, (b, s), device="cuda")
            out = model(input_ids=ids, use_cache=False).logits
            del out, ids


def run_graphs(model, shapes):
    graphs = []
    with torch.no_grad():
        side = torch.cuda.Stream()
        for b, s in reversed(shapes):  # largest first, as vLLM captures
            ids = torch.randint(0, 1024, (b, s), device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warmup on a side stream, as PyTorch advises
                    model(input_ids=ids, use_cache=False)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = model(input_ids=ids, use_cache=False).logits
            graphs.append((g, ids, out))
        for g, ids, _ in graphs:
            ids.copy_(torch.randint(0, 1024, ids.shape, device="cuda"))
            g.replay()
        torch.cuda.synchronize()
    return graphs


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    torch.cuda.reset_peak_memory_stats()
    model, shapes = model_and_inputs()
    keep = run_graphs(model, shapes) if mode == "graphs" else run_eager(model, shapes)
    torch.cuda.synchronize()
    path = os.path.join(out_dir, f"torch-{mode}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    actions = {}
    for trace in snap.get("device_traces", []):
        for e in trace:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
    info = {
        "mode": mode,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "segments": len(snap.get("segments", [])),
        "trace_actions": actions,
        "snapshot_keys": sorted(snap.keys()),
    }
    with open(os.path.join(out_dir, f"torch-{mode}.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    print(json.dumps(info, sort_keys=True))
    del keep


if __name__ == "__main__":
    main()
