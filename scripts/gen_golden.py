#!/usr/bin/env python3
"""Generates tests/golden/<arch>.safetensors, the golden values of tests/unit/model/golden_test.cpp.

For each arch (llama, gpt2) it builds a small model with bench/reference/ref_model.py (the plain
PyTorch transformer the benchmarks compare keel with), computes in fp32 the loss and the gradient
of every parameter on fixed tokens, and writes, under keel's parameter names:
  param.<name>  the weights (F32)        grad.<name>  d loss / d weight (F32)
  inputs, targets (B, T) I64             loss ()  F32
and in __metadata__ keel's ModelConfig fields (YAML keys), the torch version and the conventions.
The reference is configured to keel's conventions, not the benchmark's defaults: rotate-half rotary
pairing (x[i], x[i + D/2]), rotary tables in float64 cast to fp32, norm eps 1e-5, keel's fused
layouts (qkv = [q | k | v] rows, llama's fc = [gate | up] rows), kv head j serving query heads
j*H/Hkv .., causal attention, cross-entropy in fp32 plus z_loss * mean(logsumexp^2).
Weights are not keel's init (that is covered elsewhere) but larger, so that attention is far from
uniform and the nonlinearities leave their linear range: every matrix normal(0, 0.1), norm gains
1 + normal(0, 0.1), biases normal(0, 0.05).

Run with the torch that keel links (its version goes into the files):
  ~/.cache/keel/torch-2.11.0/bin/python scripts/gen_golden.py [--out-dir tests/golden]
The output is deterministic (fixed seed, one thread): rerunning it rewrites identical files.
"""
import argparse
import json
import os
import struct
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "reference"))
from ref_model import Model  # noqa: E402  (bench/reference is not a package)

FORMAT, VERSION = "keel-golden", "1"
SEED = 11  # issue #11
BATCH = 2
WEIGHT_STD, GAIN_STD, BIAS_STD = 0.1, 0.1, 0.05

# keel ModelConfig fields (config/schema.h) of each golden model. llama: grouped-query attention
# (4 query heads on 2 kv heads), tied embeddings, no z-loss (keel's defaults), and no qk-norm (the
# plain Llama the reference builds; keel's llama default since issue 47 has it); d_ff 44 leaves a
# 4-float tail after the 8-float AVX2 lanes of the fused SwiGLU. gpt2: untied head and a z-loss,
# so that both of keel's head and loss paths are covered.
CONFIGS = {
    "llama": dict(arch="llama", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                  seq_len=16, d_ff=44, dropout=0.0, tie_embeddings=True, qk_norm=False, z_loss=0.0),
    "gpt2": dict(arch="gpt2", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                 seq_len=16, d_ff=40, dropout=0.0, tie_embeddings=False, qk_norm=False, z_loss=1e-3),
}


def name_map(cfg):
    """[(keel name, [reference names])]: keel's tensor is the reference tensors stacked by rows."""
    llama = cfg["arch"] == "llama"
    out = [("tok_emb.weight", ["emb.weight"])]
    if not llama:
        out.append(("pos_emb.weight", ["pos.weight"]))
    suffixes = ["weight"] if llama else ["weight", "bias"]
    for i in range(cfg["n_layers"]):
        k, r = f"layers.{i}.", f"blocks.{i}."
        fc = ["gate", "up"] if llama else ["up"]
        for s in suffixes:
            out += [(f"{k}attn_norm.{s}", [f"{r}attn_norm.{s}"]),
                    (f"{k}attn.qkv.{s}", [f"{r}q.{s}", f"{r}k.{s}", f"{r}v.{s}"]),
                    (f"{k}attn.proj.{s}", [f"{r}o.{s}"]),
                    (f"{k}mlp_norm.{s}", [f"{r}mlp_norm.{s}"]),
                    (f"{k}mlp.fc.{s}", [f"{r}{m}.{s}" for m in fc]),
                    (f"{k}mlp.proj.{s}", [f"{r}down.{s}"])]
    out += [(f"final_norm.{s}", [f"norm.{s}"]) for s in suffixes]
    if not cfg["tie_embeddings"]:
        out.append(("lm_head.weight", ["lm_head.weight"]))
    return out


def build(cfg):
    model = Model(cfg["vocab_size"], cfg["d_model"], cfg["n_layers"], cfg["n_heads"],
                  cfg["n_kv_heads"], cfg["d_ff"], cfg["seq_len"], arch=cfg["arch"], rope="half",
                  tie=cfg["tie_embeddings"], z_loss=cfg["z_loss"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, WEIGHT_STD)
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
            else:  # norm gains
                p.copy_(1.0 + GAIN_STD * torch.randn_like(p))
    return model


def loss_and_grads(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    loss = model(inputs, targets)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def to_keel(mapping, ref):
    return {k: torch.cat([ref[r] for r in refs], 0) for k, refs in mapping}


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def write_safetensors(path, tensors, metadata):
    """safetensors as keel's reader and Hugging Face's writer lay it out: u64 header length, JSON
    header (space-padded to 8 bytes), tensors sorted by alignment then name, without gaps."""
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in order:
        t = tensors[name].detach().contiguous().cpu()
        blob = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def generate(arch, out_dir):
    cfg = CONFIGS[arch]
    torch.manual_seed(SEED)
    model = build(cfg)
    mapping = name_map(cfg)
    covered = sorted(r for _, refs in mapping for r in refs)
    assert covered == sorted(n for n, _ in model.named_parameters()), "name map misses a parameter"
    tokens = torch.randint(cfg["vocab_size"], (BATCH, cfg["seq_len"] + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    loss, grads = loss_and_grads(model, inputs, targets)
    # The same computation in float64: how far the fp32 golden values are from exact.
    # Measured on keel's tensors, as the test does: the k part of gpt2's qkv.bias has a gradient
    # that is zero in exact arithmetic (softmax ignores a shift shared by all keys), so alone it is
    # pure rounding noise.
    loss64, grads64 = loss_and_grads(model.double(), inputs, targets)
    model.float()
    g32, g64 = to_keel(mapping, grads), to_keel(mapping, grads64)
    fp32_err = max([rel_err(loss, loss64)] + [rel_err(g32[k], g64[k]) for k in g32])

    params = to_keel(mapping, dict(model.named_parameters()))
    tensors = {"inputs": inputs, "targets": targets, "loss": loss}
    tensors.update({f"param.{k}": v for k, v in params.items()})
    tensors.update({f"grad.{k}": v for k, v in g32.items()})
    metadata = {
        "format": FORMAT, "version": VERSION,
        "generated_by": "scripts/gen_golden.py (do not edit; regenerate with the script)",
        "torch_version": torch.__version__,
        "reference": "bench/reference/ref_model.py Model(arch, rope='half', tie, z_loss), fp32",
        "conventions": "rotate-half rotary (x[i], x[i+D/2]), base 10000, float64 tables cast to "
                       "fp32; norm eps 1e-5; qkv.weight = [q;k;v] rows; llama mlp.fc = [gate;up] "
                       "rows; kv head j serves query heads j*H/Hkv..; loss = mean fp32 "
                       "cross-entropy + z_loss * mean(logsumexp^2)",
        "weights": f"seed {SEED}: matrices N(0, {WEIGHT_STD}), norm gains 1 + N(0, {GAIN_STD}), "
                   f"biases N(0, {BIAS_STD})",
        "batch": str(BATCH), "seed": str(SEED), "loss_value": repr(loss.item()),
        "fp32_vs_fp64_max_rel_error": f"{fp32_err:.3g}",
    }
    metadata.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in cfg.items()})
    path = os.path.join(out_dir, f"{arch}.safetensors")
    write_safetensors(path, tensors, metadata)
    print(f"{path}: loss {loss.item():.6f}, {len(params)} tensors, "
          f"{sum(p.numel() for p in params.values())} parameters, {os.path.getsize(path)} bytes, "
          f"fp32 vs fp64 max rel error {fp32_err:.2g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "tests", "golden"))
    ap.add_argument("--arch", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    a = ap.parse_args()
    torch.set_num_threads(1)  # one reduction order: identical files on every run
    os.makedirs(a.out_dir, exist_ok=True)
    for arch in a.arch:
        generate(arch, a.out_dir)


if __name__ == "__main__":
    main()
