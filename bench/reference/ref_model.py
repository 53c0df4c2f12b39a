"""The plain PyTorch (eager) transformer that keel's benchmarks and golden values compare against.

Imported by bench/reference/train_ref.py (the benchmark's training loop) and scripts/gen_golden.py
(tests/golden/*.safetensors), so both use this one definition. Legend: B batch, T sequence,
C d_model, H heads, Hkv kv heads, D head dim (C / H), F MLP hidden size, V vocabulary.

  arch="llama": RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases
  arch="gpt2":  LayerNorm, learned positions, GELU(tanh) MLP, biases everywhere

Conventions, each a constructor argument where keel and the benchmark's historical default differ:
  rope="interleaved"  rotates the pairs (x[2i], x[2i+1]) (the benchmark's default; same cost)
  rope="half"         rotates the pairs (x[i], x[i + D/2]), keel's "rotate half" layout
Shared with keel: norm eps 1e-5, rotary base 10000 with tables computed in float64 then cast to
fp32, kv head j serving query heads j*H/Hkv .. (SDPA's enable_gqa, keel's repeat_kv), causal SDPA,
cross-entropy in fp32 plus an optional z-loss term z_loss * mean(logsumexp(logits)^2).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

NORM_EPS = 1e-5
ROPE_BASE = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, d, eps=NORM_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_interleaved(x, cos, sin):  # x (B, H, T, D), cos/sin (T, D/2)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def rope_half(x, cos, sin):  # x (B, H, T, D), cos/sin (T, D/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


ROPE = {"interleaved": rope_interleaved, "half": rope_half}


def rope_tables(seq_len, head_dim):  # -> cos, sin (T, D/2) fp32
    inv = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


class Block(nn.Module):
    def __init__(self, d, h, kv, ff, arch="llama", rope="interleaved"):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.llama = arch == "llama"
        self.rope = ROPE[rope]
        bias = not self.llama
        norm = RMSNorm if self.llama else (lambda n: nn.LayerNorm(n, eps=NORM_EPS))
        self.attn_norm, self.mlp_norm = norm(d), norm(d)
        self.q = nn.Linear(d, d, bias=bias)
        self.k = nn.Linear(d, kv * self.hd, bias=bias)
        self.v = nn.Linear(d, kv * self.hd, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)
        if self.llama:
            self.gate = nn.Linear(d, ff, bias=False)
        self.up = nn.Linear(d, ff, bias=bias)
        self.down = nn.Linear(ff, d, bias=bias)

    def forward(self, x, cos, sin):  # x (B, T, C); cos/sin (T, D/2) or None (gpt2)
        B, T, C = x.shape
        y = self.attn_norm(x)
        q = self.q(y).view(B, T, self.h, self.hd).transpose(1, 2)  # (B, H, T, D)
        k = self.k(y).view(B, T, self.kv, self.hd).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        if cos is not None:
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        y = self.mlp_norm(x)
        if self.llama:
            return x + self.down(F.silu(self.gate(y)) * self.up(y))
        return x + self.down(F.gelu(self.up(y), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, vocab, d, layers, h, kv, ff, T, arch="llama", rope="interleaved", tie=True,
                 z_loss=0.0):
        super().__init__()
        if arch not in ("llama", "gpt2"):
            raise ValueError(f"arch must be llama or gpt2, got {arch!r}")
        self.llama, self.z_loss = arch == "llama", z_loss
        self.emb = nn.Embedding(vocab, d)
        if not self.llama:
            self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, h, kv, ff, arch, rope) for _ in range(layers))
        self.norm = RMSNorm(d) if self.llama else nn.LayerNorm(d, eps=NORM_EPS)
        self.lm_head = None if tie else nn.Linear(d, vocab, bias=False)
        cos, sin = rope_tables(T, d // h) if self.llama else (None, None)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):  # idx, targets (B, T) int64 -> () mean loss
        T = idx.shape[1]
        x = self.emb(idx)  # (B, T, C)
        if not self.llama:
            x = x + self.pos(torch.arange(T, device=idx.device))
        cos = self.cos[:T] if self.llama else None
        sin = self.sin[:T] if self.llama else None
        for b in self.blocks:
            x = b(x, cos, sin)
        head = self.emb.weight if self.lm_head is None else self.lm_head.weight  # (V, C)
        logits = self.norm(x) @ head.t()  # (B, T, V)
        flat = logits.float().reshape(-1, logits.size(-1))
        loss = F.cross_entropy(flat, targets.reshape(-1))
        if self.z_loss > 0:
            loss = loss + self.z_loss * torch.logsumexp(flat, -1).square().mean()
        return loss
