#!/usr/bin/env python3
"""Plain PyTorch (eager) training loop of the same model keel trains, as a user would write it.

Same architecture (llama-style: RMSNorm, RoPE, SwiGLU, SDPA causal attention, tied embeddings),
same batch, precision, optimizer (AdamW, fused when available) and thread count; the data is
random tokens of the same shape (throughput does not depend on values). Prints one JSON line:
{"tokens_per_s": ..., "step_ms": ..., "params": ...}. Used by bench/run.sh, side by side with keel.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x, cos, sin):  # x (B, H, T, D)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, d, h, kv, ff):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv * self.hd, bias=False)
        self.v = nn.Linear(d, kv * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, ff, bias=False)
        self.up = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        y = self.attn_norm(x)
        q = self.q(y).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Model(nn.Module):
    def __init__(self, vocab, d, layers, h, kv, ff, T):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h, kv, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        hd = d // h
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = self.norm(x) @ self.emb.weight.t()
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


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
