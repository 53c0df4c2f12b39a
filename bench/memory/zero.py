#!/usr/bin/env python3
"""The memory plan against the measured peak, per rank, for ZeRO 0/1/2/3 and activation
checkpointing, at 1 and 4 ranks (CPU, Gloo on loopback).

Each configuration trains the same llama for --steps steps and reads the run's `memory` event:
the plan's parts and total (what `keel validate` prints) and the peak per rank the caching host
allocator measured (its blocks of 1 MiB and more; the maximum over the ranks). The first table
is the plan against the peak; the second, model states alone: with a micro-batch of one short
sequence the activations are small, so the peak is the weights, gradients, optimizer state and
(ZeRO-3) gathered units. The last column is the largest rank's maximum resident set over the
whole process, construction included (getrusage of the processes keel launch waited for): ZeRO-3
builds the model unit by unit as it shards it, so no rank ever holds the whole model.

  python3 bench/memory/zero.py --keel build/keel           # ~160M parameters, ~10 min, 2 cores
  python3 bench/memory/zero.py --keel build/keel --states-only   # the second table alone
"""
import argparse
import json
import os
import subprocess
import tempfile

# ~160M parameters: 16 blocks of d_model 768 (7.1M each) and an 8,192-word vocabulary, so the
# blocks, not the embedding, are most of the model (as in the large models ZeRO-3 is for).
MODEL = ["model.arch=llama", "model.d_model=768", "model.n_layers=16", "model.n_heads=12",
         "model.vocab_size=8192", "model.tie_embeddings=false"]


def run(keel, ranks, extra, tokens):
    seq, batch = tokens
    with tempfile.TemporaryDirectory(prefix="keel-zero-mem-") as tmp:
        sets = MODEL + [f"model.seq_len={seq}", f"data.micro_batch_size={batch}",
                        "run.max_steps=3", "schedule.warmup_steps=1", "eval.every_steps=0",
                        "eval.batches=1", "logging.progress=off", "checkpoint.every_steps=0",
                        "checkpoint.stable.every_steps=0", "stability.enabled=false",
                        f"run.threads={max(1, os.cpu_count() // ranks)}", *extra]
        cmd = [keel] + (["launch", "--nproc", str(ranks), "--"] if ranks > 1 else [])
        cmd += ["train", "--run-dir", os.path.join(tmp, "run")]
        for x in sets:
            cmd += ["--set", x]
        # A wrapper process of its own, so that its children's maximum resident set is this run's.
        wrapper = ("import resource, subprocess, sys; "
                   "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
                   "stderr=subprocess.DEVNULL); "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        out = subprocess.run(["python3", "-c", wrapper] + cmd, check=True, capture_output=True,
                             text=True).stdout
        max_rss = int(out.split()[-1]) * 1024  # KiB on Linux
        with open(os.path.join(tmp, "run", "events.jsonl")) as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] == "memory":
                    return dict(e["detail"], max_rss=max_rss)
    raise RuntimeError("no memory event")


def mb(x):
    return f"{x / 1e6:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence (plan table)")
    ap.add_argument("--states-only", action="store_true", help="the model-states table alone")
    args = ap.parse_args()
    configs = [(1, "zero 0", ["distributed.zero=0"]),
               (1, "zero 0, full", ["distributed.zero=0", "model.activation_checkpointing=full"]),
               (4, "zero 0", ["distributed.zero=0"]),
               (4, "zero 1", ["distributed.zero=1"]),
               (4, "zero 3", ["distributed.zero=3"]),
               (4, "zero 3, full", ["distributed.zero=3", "model.activation_checkpointing=full"]),
               (4, "zero 1, full", ["distributed.zero=1", "model.activation_checkpointing=full"])]
    if args.states_only:
        configs = []
    else:
        print(f"Plan against measured peak per rank, {args.seq} tokens per micro-batch:\n")
        print("| ranks | config | plan MB | of which gathered | measured peak MB | peak / plan |")
        print("|---|---|---|---|---|---|")
    for ranks, name, extra in configs:
        d = run(args.keel, ranks, extra, (args.seq, 1))
        p = d["plan"]
        print(f"| {ranks} | {name} | {mb(p['total'])} | {mb(p.get('gathered', 0))} | "
              f"{mb(d['peak_bytes'])} | {d['peak_bytes'] / p['total']:.3f} |")
    print("\nModel states at 4 ranks (one sequence of 16 tokens per micro-batch):\n")
    print("| config | measured peak MB per rank | of zero 0 | max resident MB (whole process) |")
    print("|---|---|---|---|")
    base = None
    for name, extra in [("zero 0", ["distributed.zero=0"]), ("zero 1", ["distributed.zero=1"]),
                        ("zero 2", ["distributed.zero=2"]), ("zero 3", ["distributed.zero=3"])]:
        d = run(args.keel, 4, extra, (16, 1))
        peak = d["peak_bytes"]
        base = base or peak
        print(f"| {name} | {mb(peak)} | {100 * peak / base:.1f} % | {mb(d['max_rss'])} |")


if __name__ == "__main__":
    main()
