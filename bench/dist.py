#!/usr/bin/env python3
"""One rank against two, on the same global batch: step time, tokens/s and the all-reduce's share.

The same model and global batch trained four ways, alternating, --reps times:
  1 rank  x micro-batch 2B, run.threads = cores
  2 ranks x micro-batch B (keel launch --nproc 2), run.threads = cores / 2 each, Gloo on loopback,
          with distributed.overlap true (gradient buckets all-reduced during the backward pass)
          and false (one flat all-reduce after it), and with ZeRO-1 (distributed.zero=1: the
          buckets reduce-scattered, each rank updates half the weights, and an all-gather after
          the optimizer step, which step_ms holds and comm_ms does not, gives both the whole model),
          with ZeRO-2 (distributed.zero=2: every micro-step's buckets reduce-scattered and no
          whole gradient kept), and ZeRO-2 with activation checkpointing selective and full
          (the backward pass recomputes the norms and activations, or whole blocks), and ZeRO-3
          (distributed.zero=3: each unit's weights all-gathered before it runs, forward and
          backward, its gradients reduce-scattered; the gathers' wait is in step_ms, not comm_ms)
          with checkpointing off, selective and full
and the median over logged steps after the first --skip (warm-up) is reported, with the peak per
rank from the run's `memory` event (the caching host allocator's blocks of 1 MiB and more). `comm_ms`
(metrics.jsonl) is the host time the step waited for the gradient all-reduce after the backward
pass: with overlap, the part the backward pass did not hide.

  python3 bench/dist.py --keel build/keel                 # small and medium models (~5 min, 2 cores)
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

SHAPES = {
    # The small and medium models of bench/run.py; `batch` is the global batch.
    "small": dict(d_model=128, n_layers=4, n_heads=4, seq_len=128, batch=16, steps=40),
    "medium": dict(d_model=320, n_layers=8, n_heads=5, seq_len=256, batch=8, steps=15),
}


def run(keel, shape, ranks, cores, skip, extra=()):
    s = SHAPES[shape]
    with tempfile.TemporaryDirectory(prefix="keel-dist-") as tmp:
        sets = ["model.arch=llama", "model.vocab_size=256", f"model.d_model={s['d_model']}",
                f"model.n_layers={s['n_layers']}", f"model.n_heads={s['n_heads']}",
                f"model.seq_len={s['seq_len']}", f"data.micro_batch_size={s['batch'] // ranks}",
                f"run.max_steps={s['steps']}", "schedule.warmup_steps=1", "eval.every_steps=0",
                "eval.batches=1", "logging.every_steps=1", "logging.progress=off",
                f"run.threads={max(1, cores // ranks)}", "checkpoint.every_steps=0", *extra]
        cmd = [keel] + (["launch", "--nproc", str(ranks), "--"] if ranks > 1 else [])
        cmd += ["train", "--run-dir", os.path.join(tmp, "run")]
        for x in sets:
            cmd += ["--set", x]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f][skip:]
        step = statistics.median(r["step_ms"] for r in rows)
        tok = statistics.median(r["tokens_per_s"] for r in rows)
        comm = statistics.median(r.get("comm_ms", 0.0) for r in rows)
        peak = 0.0
        with open(os.path.join(tmp, "run", "events.jsonl")) as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] == "memory":
                    peak = e["detail"].get("peak_bytes", 0.0)
    return step, tok, comm, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--configs", nargs="+", default=["small", "medium"], choices=list(SHAPES))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip", type=int, default=3, help="logged steps left out at the start")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    args = ap.parse_args()
    print("| model | ranks x micro-batch | threads per rank | step ms (median) | tokens/s | "
          "all-reduce wait ms | its share | peak MB per rank |")
    print("|---|---|---|---|---|---|---|---|")
    ways = [("1 rank", 1, ()), ("2 ranks, overlap", 2, ("distributed.overlap=true",)),
            ("2 ranks, no overlap", 2, ("distributed.overlap=false",)),
            ("2 ranks, overlap, zero 1", 2, ("distributed.overlap=true", "distributed.zero=1")),
            ("2 ranks, overlap, zero 2", 2, ("distributed.overlap=true", "distributed.zero=2")),
            ("2 ranks, zero 2, selective", 2,
             ("distributed.zero=2", "model.activation_checkpointing=selective")),
            ("2 ranks, zero 2, full", 2,
             ("distributed.zero=2", "model.activation_checkpointing=full")),
            ("2 ranks, zero 3", 2, ("distributed.zero=3",)),
            ("2 ranks, zero 3, selective", 2,
             ("distributed.zero=3", "model.activation_checkpointing=selective")),
            ("2 ranks, zero 3, full", 2,
             ("distributed.zero=3", "model.activation_checkpointing=full"))]
    for shape in args.configs:
        results = {name: [] for name, _, _ in ways}
        for _ in range(args.reps):
            for name, ranks, extra in ways:
                results[name].append(run(args.keel, shape, ranks, args.cores, args.skip, extra))
        for name, ranks, _ in ways:
            step = statistics.median(r[0] for r in results[name])
            tok = statistics.median(r[1] for r in results[name])
            comm = statistics.median(r[2] for r in results[name])
            peak = statistics.median(r[3] for r in results[name])
            batch = SHAPES[shape]["batch"] // ranks
            share = f"{100 * comm / step:.1f} %" if ranks > 1 else "—"
            comm_cell = f"{comm:.2f}" if ranks > 1 else "—"
            print(f"| {shape} | {name}: {ranks} x {batch} | {max(1, args.cores // ranks)} | "
                  f"{step:.1f} | {tok:,.0f} | {comm_cell} | {share} | {peak / 1e6:.1f} |")


if __name__ == "__main__":
    main()
