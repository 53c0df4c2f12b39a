#!/usr/bin/env python3
"""The guard's cost per training step, in CPU seconds of the keel process rather than wall time.

Wall-clock A/B runs on a shared machine drift by ±10 % between adjacent runs, more than the
effect being measured; the CPU time the process itself consumes (user + system, getrusage) does
not count the time it waited for a core. (Instruction counts would be steadier still, but this
VM exposes no hardware counters to perf.) Setup costs differ between the two modes (the guard
writes a stable snapshot of the initial weights), so each mode runs with S1 and S2 steps and the
per-step figure is the difference divided by S2 - S1: setup cancels out. Guard off, guard on with
the update gated on the device (stability.update_gate: device, the default) and guard on with the
update waiting for the host (update_gate: host) alternate, --reps times; the medians are reported.

  python3 bench/guard_overhead.py --keel build/keel        # medium config, 10 and 30 steps
"""
import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time

# The medium config of bench/run.py.
MODEL = ["model.arch=llama", "model.vocab_size=256", "model.d_model=320", "model.n_layers=8",
         "model.n_heads=5", "model.seq_len=256", "data.micro_batch_size=8"]


MODES = {"off": ["stability.enabled=false"],
         "device": ["stability.enabled=true", "stability.update_gate=device"],
         "host": ["stability.enabled=true", "stability.update_gate=host"]}


def cpu_seconds(keel, steps, mode, threads):
    """(CPU seconds, wall seconds) of one keel run of the medium config."""
    with tempfile.TemporaryDirectory(prefix="keel-guard-") as tmp:
        sets = MODEL + [f"run.max_steps={steps}", "schedule.warmup_steps=1", "eval.every_steps=0",
                        "eval.batches=1", "logging.every_steps=10", "logging.progress=off", "checkpoint.every_steps=0",
                        f"run.threads={threads}"] + MODES[mode]
        cmd = [keel, "train", "--run-dir", os.path.join(tmp, "run")]
        for s in sets:
            cmd += ["--set", s]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return cpu, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--steps", type=int, nargs=2, default=[10, 30])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = ap.parse_args()
    s1, s2 = args.steps
    per_step = {m: {"cpu": [], "wall": []} for m in args.modes}
    for rep in range(args.reps):
        for mode in args.modes:
            c1, w1 = cpu_seconds(args.keel, s1, mode, args.threads)
            c2, w2 = cpu_seconds(args.keel, s2, mode, args.threads)
            per_step[mode]["cpu"].append((c2 - c1) / (s2 - s1))
            per_step[mode]["wall"].append((w2 - w1) / (s2 - s1))
            print(f"rep {rep + 1} guard {mode:6s}: {per_step[mode]['cpu'][-1] * 1e3:.1f} "
                  f"CPU-ms/step, {per_step[mode]['wall'][-1] * 1e3:.1f} wall-ms/step", flush=True)
    print(f"per training step, medium config (10.2M parameters), steps {s1}..{s2}, logging every 10, "
          f"{args.threads} threads, median of {args.reps}:")
    base = "off" if "off" in args.modes else args.modes[0]
    for k in ("cpu", "wall"):
        ref = statistics.median(per_step[base][k])
        for mode in args.modes:
            v = statistics.median(per_step[mode][k])
            print(f"  {k:4s} guard {mode:6s} {v * 1e3:7.1f} ms: {(v / ref - 1) * 100:+.2f} % against {base}")


if __name__ == "__main__":
    main()
