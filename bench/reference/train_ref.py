#!/usr/bin/env python3
"""Plain PyTorch (eager) training loop of the same model keel trains, as a user would write it.

Same architecture (llama-style: RMSNorm, RoPE, SwiGLU, SDPA causal attention, tied embeddings),
same batch, precision, optimizer (AdamW, fused when available) and thread count; the data is
random tokens of the same shape (throughput does not depend on values). The model is
bench/reference/ref_model.py's (shared with scripts/gen_golden.py). Prints one JSON line:
{"tokens_per_s": ..., "step_ms": ..., "params": ...}. Used by bench/run.sh, side by side with keel.
"""
import argparse
import json
import time

import torch

from ref_model import Model  # this file's folder is on sys.path when run as a script


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("vocab", 256), ("d_model", 128), ("layers", 2), ("heads", 4), ("kv_heads", 0),
                          ("d_ff", 0), ("seq_len", 128), ("batch", 16), ("steps", 30), ("warmup", 5),
                          ("threads", 0)]:
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    kv = a.kv_heads or a.heads
    ff = a.d_ff or ((8 * a.d_model // 3 + 63) // 64) * 64
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = Model(a.vocab, a.d_model, a.layers, a.heads, kv, ff, a.seq_len).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), fused=True)
    data = torch.randint(a.vocab, (a.batch, a.seq_len + 1), device=dev)
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
        if step == a.warmup + a.steps - 1:
            loss.item()
    times.sort()
    median = times[len(times) // 2]
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"tokens_per_s": a.batch * a.seq_len / median, "step_ms": median * 1e3,
                      "params": params, "loss": loss.item()}))


if __name__ == "__main__":
    main()
