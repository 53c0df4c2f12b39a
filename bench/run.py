#!/usr/bin/env python3
"""Training throughput: keel against a plain PyTorch loop of the same model.

For each model size keel and bench/reference/train_ref.py (eager PyTorch, the loop a user would
write) train the same llama-style model with the same batch, precision, device and thread count,
alternately (keel, reference, keel, reference, ...) so that a drift in machine load hits both
alike; each ratio keel/reference is taken within one pair. Both run the same torch release (keel
links the LibTorch of the torch wheel this script runs under), so the difference is the trainer.

Also measured, on the medium model:
  guard overhead     keel with stability.enabled true vs false, in the same rotation as the pairs;
  guard time share   sum(guard_ms) / sum(step_ms): the guard's own time measured inside the step;
  loader wait share  sum(loader_wait_ms) / sum(step_ms) over keel's timed steps;
  checkpoint stall   one run saving every --ckpt-every steps, sync and async: total stall_s of the
                     saves that land in the timed steps / total time of those steps.

MFU is model FLOPs/token (keel's 6*N_nonembedding + 12*L*C*T + 6*C*V, as keel's run_start event
reports it, for keel and the reference alike) x tokens/s / the peak matmul rate measured here with
the same torch, device, dtype and threads: the best of several 2048^3 fp32 matmuls on the CPU
(ATen's mm and oneDNN, whichever is faster), 8192^3 in the run's dtype on a GPU.

Progress goes to stderr, the Markdown report to stdout:

  bench/run.sh                        # CPU: small, medium, gpt2s, 5 pairs (~20 min on 2 cores)
  bench/run.sh --configs small --pairs 1 --warmup 1 --steps 3     # a smoke test
  bench/run.sh --json bench-cpu.json > bench-cpu.md
  scripts/gpu_check.sh                # CUDA, bf16: the 124m and 350m configs
"""
import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "bench", "reference", "train_ref.py")


@dataclass(frozen=True)
class Shape:
    """One benchmark model and its default step counts (10-30 s per run on its device)."""
    name: str
    vocab: int
    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    warmup: int
    steps: int
    log_every: int = 5  # a real run logs every 10; a log step also snapshots weights (update ratio)
    note: str = ""


SAME_MODEL = ("llama architecture (RMSNorm, RoPE, SwiGLU, tied embeddings) so that the reference "
              "trains the same model")
CONFIGS = {
    s.name: s for s in [
        # CPU, 2 cores.
        Shape("small", vocab=256, d_model=128, layers=4, heads=4, seq_len=128, batch=16, warmup=5, steps=40),
        # 5 heads of 64 rather than 8 of 40: the head size real models use.
        Shape("medium", vocab=256, d_model=320, layers=8, heads=5, seq_len=256, batch=8, warmup=5, steps=15),
        Shape("gpt2s", vocab=50304, d_model=768, layers=12, heads=12, seq_len=128, batch=4, warmup=2, steps=4, log_every=2,
              note="gpt2-small dimensions in keel's " + SAME_MODEL),
        # One CUDA GPU (scripts/gpu_check.sh); step counts are multiples of its --log-every 5.
        Shape("124m", vocab=50304, d_model=768, layers=12, heads=12, seq_len=1024, batch=8, warmup=5, steps=20,
              note="gpt2-small dimensions in keel's " + SAME_MODEL),
        Shape("350m", vocab=50304, d_model=1024, layers=24, heads=16, seq_len=1024, batch=4, warmup=5, steps=20,
              note="gpt2-medium dimensions in keel's " + SAME_MODEL),
    ]
}
DEFAULT_CONFIGS = {"cpu": ["small", "medium", "gpt2s"], "cuda": ["124m", "350m"]}

# The medium model carries the guard, loader and checkpoint measurements.
EXTRAS_CONFIG = "medium"

MODEL_LINE = re.compile(r"with [0-9.]+M parameters, ([0-9.]+) MFLOPs/token")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def flops_per_token(shape, params):
    """keel's Transformer::flops_per_token for a llama model with tied embeddings; only for keel
    binaries whose run_start event lacks flops_per_token."""
    C, V, L, T = shape.d_model, shape.vocab, shape.layers, shape.seq_len
    return 6.0 * (params - V * C) + 12.0 * L * C * T + 6.0 * C * V


def run_keel(args, shape, warmup, steps, extra=()):
    """One `keel train` run on the embedded default config with this shape; the figures of its
    timed steps (those after `warmup`). A metrics record holds the mean of the steps since the
    previous one, so records are weighted by the steps they cover. keel writes a step's record
    before the end-of-run eval and checkpoint, so the last step is as clean as the others; the
    first step's window holds keel's start-up (the initial stable snapshot), which warmup >= 1
    leaves out."""
    log_every = args.log_every or shape.log_every
    sets = [
        "model.arch=llama", "model.qk_norm=off",  # the reference model has no q/k norms
        f"model.vocab_size={shape.vocab}", f"model.d_model={shape.d_model}",
        f"model.n_layers={shape.layers}", f"model.n_heads={shape.heads}", f"model.seq_len={shape.seq_len}",
        f"data.micro_batch_size={shape.batch}",
        f"run.threads={args.threads}", f"run.device={args.device}", f"run.precision={args.precision}",
        f"run.max_steps={warmup + steps}", "schedule.warmup_steps=1",
        "eval.every_steps=0", "eval.batches=1", f"logging.every_steps={log_every}", "logging.progress=off",
        "checkpoint.every_steps=0", *args.keel_set, *extra,
    ]
    tmp = tempfile.mkdtemp(prefix="keel-bench-")
    try:
        run_dir = os.path.join(tmp, "run")
        cmd = [args.keel, "train", "--run-dir", run_dir]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.perf_counter()
        # In the temp dir: keel's free-space check looks at run.out_dir, relative to the cwd.
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        wall_s = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"keel failed (exit {proc.returncode}):\n  {' '.join(cmd)}\n{proc.stdout[-3000:]}")
        metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
        # The end-of-run save, which every run makes: the size of one checkpoint.
        ckpt_dir = [e for e in events if e["kind"] == "checkpoint"][-1]["detail"]["path"]
        ckpt_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt_dir) for f in fs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    start = next(e["detail"] for e in events if e["kind"] == "run_start")
    params = start["parameters"]
    # keel's own FLOPs/token (Transformer::flops_per_token), used for both sides' MFU.
    fpt = start.get("flops_per_token")
    if fpt is None:
        # A keel from before run_start carried flops_per_token: this script's copy of the formula,
        # checked against the figure keel logs (rounded to 0.01 MFLOPs).
        fpt = flops_per_token(shape, params)
        m = MODEL_LINE.search(proc.stdout)
        if not m:
            sys.exit("keel's log has no 'with X M parameters, Y MFLOPs/token' line:\n" + proc.stdout[-3000:])
        if abs(fpt / 1e6 - float(m.group(1))) > 0.006:
            sys.exit(f"{shape.name}: keel logs {m.group(1)} MFLOPs/token, the formula here gives {fpt / 1e6:.2f}")

    redone = sorted({e["kind"] for e in events if e["kind"] in ("rollback", "skip_nan")})
    if redone:
        sys.exit(f"{shape.name}: keel's guard intervened ({', '.join(redone)}): steps were redone or skipped, "
                 "so the run's timing is not comparable")
    windows, prev = [], 0  # (steps covered, record) of the timed records
    for r in metrics:
        if r["step"] > warmup:
            windows.append((r["step"] - prev, r))
        prev = r["step"]
    if sum(k for k, _ in windows) != steps or any(r["step"] - k < warmup for k, r in windows):
        sys.exit(f"{shape.name}: keel's records do not cover exactly steps {warmup + 1}..{warmup + steps}; "
                 f"warmup and steps must be multiples of --log-every {log_every}")
    median_ms = statistics.median(r["step_ms"] for _, r in windows)
    # A save after step s stalls the window of step s+1: those of s in [warmup, max_steps) are timed.
    stalls = [e["detail"]["stall_s"] for e in events
              if e["kind"] == "checkpoint" and warmup <= e["step"] < warmup + steps]
    return {
        "params": params, "flops_per_token": fpt, "step_ms": median_ms,
        "tokens_per_s": shape.batch * shape.seq_len / (median_ms / 1e3),
        "timed_ms": sum(k * r["step_ms"] for k, r in windows),
        "loader_wait_ms": sum(k * r["loader_wait_ms"] for k, r in windows),
        "guard_ms": sum(k * r.get("guard_ms", 0.0) for k, r in windows),
        "checkpoint_stalls_s": stalls, "checkpoint_bytes": ckpt_bytes, "wall_s": wall_s,
    }


def run_reference(args, shape, warmup, steps):
    """One run of the plain PyTorch loop; its JSON line (tokens_per_s, step_ms median, params)."""
    cmd = [args.python, REFERENCE, f"--vocab={shape.vocab}", f"--d-model={shape.d_model}",
           f"--layers={shape.layers}", f"--heads={shape.heads}", f"--seq-len={shape.seq_len}",
           f"--batch={shape.batch}", f"--steps={steps}", f"--warmup={warmup}", f"--threads={args.threads}",
           f"--device={args.device}", f"--precision={args.precision}"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"reference failed (exit {proc.returncode}):\n  {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def onednn_mm(a, b):
    """a @ b through LibTorch's oneDNN GEMM, the one keel's run.cpu_matmul=onednn uses on the CPU
    (mkldnn::_linear_pointwise computes x @ w^T, so w is b^T); None when torch has no oneDNN."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None:
        return None
    return lambda: op(a, b.t(), None, "none", [], "")


def peak_matmul_flops(device, precision, threads):
    """Best rate of a square matmul with this torch, device, dtype and thread count: the MFU
    denominator. On the CPU both of LibTorch's GEMMs are timed (ATen's mm, which is MKL, and
    oneDNN, which keel uses for most of its GEMMs), and the faster one is the peak, so that no
    side's MFU is flattered by a slow denominator. Returns (FLOP/s, description)."""
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    n, warmup, reps, inner = (2048, 3, 20, 1) if device == "cpu" else (8192, 10, 10, 10)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    gemms = {"ATen mm": lambda: torch.mm(a, b, out=out)}
    onednn = onednn_mm(a, b) if device == "cpu" else None
    if onednn is not None:
        gemms["oneDNN"] = onednn
    best, best_name = float("inf"), ""
    for name, gemm in gemms.items():
        for _ in range(warmup):
            gemm()
        sync()
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                gemm()
            sync()
            t = (time.perf_counter() - t0) / inner
            if t < best:
                best, best_name = t, name
    del a, b, out
    if device == "cuda":
        torch.cuda.empty_cache()
    how = f"{n}³ {precision} matmul, best of {reps}"
    if len(gemms) > 1:
        how += f" each of {', '.join(gemms)}: {best_name}"
    return 2.0 * n ** 3 / best, how


# The best matmul rate seen in this invocation. On a shared machine one measurement can land in a
# slow moment (the same 2048^3 matmul ranged 108-175 GFLOP/s on the 2-core development VM), which
# would inflate every MFU, so the peak is measured again before every pair and the best one kept.
PEAK = {"flops": 0.0, "how": "", "samples": []}


def update_peak(args):
    flops, how = peak_matmul_flops(args.device, args.precision, args.threads)
    PEAK["samples"].append(flops)
    if flops > PEAK["flops"]:
        PEAK["flops"], PEAK["how"] = flops, how


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def benchmark_config(args, shape, warmup, steps):
    """The keel/reference pairs of one config (with the guard-off runs in the same rotation when
    this config carries the extras)."""
    extras = shape.name == EXTRAS_CONFIG or args.guard_off
    keel_runs, ref_runs, off_runs = [], [], []
    for i in range(args.pairs):
        update_peak(args)
        k = run_keel(args, shape, warmup, steps)
        r = run_reference(args, shape, warmup, steps)
        keel_runs.append(k)
        ref_runs.append(r)
        line = (f"  {shape.name} pair {i + 1}/{args.pairs}: keel {k['tokens_per_s']:,.0f} tok/s, "
                f"reference {r['tokens_per_s']:,.0f} tok/s, ratio {k['tokens_per_s'] / r['tokens_per_s']:.3f}")
        if extras:
            off = run_keel(args, shape, warmup, steps, ["stability.enabled=false"])
            off_runs.append(off)
            line += f"; guard on {k['step_ms']:.1f} ms/step, off {off['step_ms']:.1f}"
        log(line)
    return keel_runs, ref_runs, off_runs


def checkpoint_runs(args, shape, warmup, steps, baseline_ms):
    """One keel run per checkpoint mode, saving every --ckpt-every steps. `baseline_ms` is the mean
    step time of the runs without checkpoints, for the slowdown a save causes beyond its stall
    (an async write competes with training for the cores)."""
    out = {}
    for mode in ("sync", "async"):
        k = run_keel(args, shape, warmup, steps,
                     [f"checkpoint.every_steps={args.ckpt_every}", f"checkpoint.async={str(mode == 'async').lower()}"])
        stall = sum(k["checkpoint_stalls_s"])
        out[mode] = {
            "saves": len(k["checkpoint_stalls_s"]), "stall_s": stall, "timed_s": k["timed_ms"] / 1e3,
            "share": stall / (k["timed_ms"] / 1e3), "slowdown": k["timed_ms"] / (baseline_ms * steps) - 1.0,
            "checkpoint_bytes": k["checkpoint_bytes"],
        }
        log(f"  checkpoint {mode}: {out[mode]['saves']} saves, stall {stall:.3f} s of "
            f"{out[mode]['timed_s']:.2f} s timed")
    return out


def summarize(shape, warmup, steps, keel_runs, ref_runs):
    params, ref_params = keel_runs[0]["params"], ref_runs[0]["params"]
    log(f"  parameters: keel {params:,}, reference {ref_params:,} ({'equal' if params == ref_params else 'DIFFERENT'})")
    fpt = keel_runs[0]["flops_per_token"]
    keel_tps = statistics.median(k["tokens_per_s"] for k in keel_runs)
    ref_tps = statistics.median(r["tokens_per_s"] for r in ref_runs)
    ratios = [k["tokens_per_s"] / r["tokens_per_s"] for k, r in zip(keel_runs, ref_runs)]
    return {
        "shape": shape.__dict__, "warmup": warmup, "steps": steps, "params": params,
        "reference_params": ref_params, "flops_per_token": fpt,
        "keel_tokens_per_s": keel_tps, "reference_tokens_per_s": ref_tps,
        "ratio_median": statistics.median(ratios), "ratios": ratios,
        "keel_runs": keel_runs, "reference_runs": ref_runs,
    }


def print_report(args, meta, results, extras):
    print(f"# keel vs plain PyTorch: {args.device} training throughput\n")
    print(f"{meta['date']}, {meta['machine']}, {meta['device_name']}, nproc {meta['nproc']}, "
          f"{args.threads} threads, torch {meta['torch']}, {args.precision}, {args.pairs} pair(s) per config, "
          "keel logging every " + (f"{args.log_every} step(s)" if args.log_every else
                                   ", ".join(f"{n}: {CONFIGS[n].log_every}" for n in results) + " steps")
          + " (a real run logs every 10).  ")
    samples = meta["peak_samples_gflops"]
    print(f"Peak matmul ({meta['peak_how']}, the best of {len(samples)} measurements taken before every "
          f"pair; they ranged {min(samples):,.0f}–{max(samples):,.0f}): {meta['peak_gflops']:,.1f} GFLOP/s, "
          "the MFU denominator.\n")
    guard = all("guard_overhead" in r for r in results.values())
    print("| config | params | keel tokens/s | reference tokens/s | keel/reference median [min–max] "
          "| keel MFU | reference MFU |" + (" guard on vs off |" if guard else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if guard else ""))
    for name, r in results.items():
        params = f"{r['params'] / 1e6:.2f}M ({r['params']:,})"
        if r["reference_params"] != r["params"]:
            params += f", reference {r['reference_params']:,}"
        print(f"| {name} | {params} | {r['keel_tokens_per_s']:,.0f} | {r['reference_tokens_per_s']:,.0f} "
              f"| {r['ratio_median']:.3f} [{min(r['ratios']):.3f}–{max(r['ratios']):.3f}] "
              f"| {r['keel_mfu'] * 100:.1f} % | {r['reference_mfu'] * 100:.1f} % |"
              + (f" {r['guard_overhead'] * 100:+.1f} % |" if guard else ""))
    print()
    for name, r in results.items():
        s = CONFIGS[name]
        note = f"; {s.note}" if s.note else ""
        print(f"- {name}: d_model {s.d_model}, {s.layers} layers, {s.heads} heads, vocab {s.vocab}, "
              f"seq_len {s.seq_len}, micro-batch {s.batch}, {r['warmup']} warm-up + {r['steps']} timed steps "
              f"per run{note}.")
    if "checkpoint" in extras:
        g, c = extras["guard"], extras["checkpoint"]
        print(f"\nOn the {EXTRAS_CONFIG} config:\n")
        print(f"- guard overhead: {g['on_step_ms']:.1f} ms/step with stability.enabled, "
              f"{g['off_step_ms']:.1f} without (medians); per pair "
              + ", ".join(f"{x * 100:+.1f}" for x in g["pair_overheads"])
              + f" %, median {g['overhead'] * 100:+.1f} %")
        print(f"- guard time inside the step (keel's guard_ms metric: its host-side checks and the one "
              f"host read): {extras['guard_share'] * 100:.3f} % of the timed step time")
        print(f"- loader wait: {extras['loader_wait_share'] * 100:.2f} % of the timed step time")
        for mode in ("sync", "async"):
            m = c[mode]
            if m["saves"] == 0:
                print(f"- checkpoint ({mode}): no save landed in the timed steps (raise --steps)")
                continue
            print(f"- checkpoint every {extras['checkpoint_every']} steps, {mode} "
                  f"({m['checkpoint_bytes'] / 1e6:.0f} MB each): {m['saves']} saves stalled "
                  f"{m['stall_s']:.3f} s of {m['timed_s']:.2f} s = {m['share'] * 100:.1f} %; the timed steps "
                  f"took {m['slowdown'] * 100:+.1f} % against the runs without checkpoints")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=os.path.join(ROOT, "build", "keel"), help="keel binary")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the reference (default: this one, whose torch keel links)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"],
                    help="default: fp32 on the CPU, bf16 on a GPU")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                    help="default: " + "; ".join(f"{d}: {' '.join(c)}" for d, c in DEFAULT_CONFIGS.items()))
    ap.add_argument("--pairs", type=int, default=5, help="keel/reference pairs per config")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads for both")
    ap.add_argument("--warmup", type=int, help="untimed steps per run (default: per config)")
    ap.add_argument("--steps", type=int, help="timed steps per run (default: per config)")
    ap.add_argument("--log-every", type=int,
                    help="keel's logging.every_steps (default: per config, 5, or 1 where a run is "
                         "a few steps); warmup and steps must be multiples of it")
    ap.add_argument("--ckpt-every", type=int, default=5, help="checkpoint interval of the stall runs")
    ap.add_argument("--keel-set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more --set for every keel run (repeatable)")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--micro-batches", action="append", default=[], metavar="CONFIG=B,B,...",
                    help="run CONFIG at each of these micro-batch sizes (as CONFIG-mbB), e.g. 124m=8,32,64")
    ap.add_argument("--guard-off", action="store_true",
                    help="a guard-off keel run beside every pair of every config: the guard's cost per shape")
    args = ap.parse_args()
    args.precision = args.precision or ("fp32" if args.device == "cpu" else "bf16")
    args.configs = list(args.configs or DEFAULT_CONFIGS[args.device])
    for spec in args.micro_batches:
        name, _, sizes = spec.partition("=")
        if name not in args.configs or not sizes:
            ap.error(f"--micro-batches {spec}: expected CONFIG=B,B,... with CONFIG among --configs")
        variants = []
        for b in sizes.split(","):
            variant = dataclasses.replace(CONFIGS[name], name=f"{name}-mb{int(b)}", batch=int(b))
            CONFIGS[variant.name] = variant
            variants.append(variant.name)
        i = args.configs.index(name)
        args.configs[i:i + 1] = variants
    counts = [args.pairs, args.threads, args.ckpt_every] + \
        [n for n in (args.warmup, args.steps, args.log_every) if n is not None]
    if min(counts) < 1:
        ap.error("counts must be >= 1 (a warm-up step keeps keel's start-up out of the timing)")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")

    update_peak(args)
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": platform.machine(), "device_name": device_name(args.device), "nproc": os.cpu_count(),
        "threads": args.threads, "torch": torch.__version__, "device": args.device,
        "precision": args.precision, "log_every": args.log_every,
    }
    log(f"peak matmul ({PEAK['how']}, {args.threads} threads): {PEAK['flops'] / 1e9:,.1f} GFLOP/s")

    results, extras = {}, {}
    for name in args.configs:
        shape = CONFIGS[name]
        warmup = args.warmup if args.warmup is not None else shape.warmup
        steps = args.steps if args.steps is not None else shape.steps
        log(f"{name}: d_model {shape.d_model}, {shape.layers} layers, {shape.heads} heads, vocab {shape.vocab}, "
            f"seq {shape.seq_len}, batch {shape.batch}; {warmup} warm-up + {steps} timed steps per run")
        keel_runs, ref_runs, off_runs = benchmark_config(args, shape, warmup, steps)
        results[name] = summarize(shape, warmup, steps, keel_runs, ref_runs)
        if off_runs:  # per pair (adjacent runs), then the median: robust to the machine's drift
            results[name]["guard_overhead"] = statistics.median(
                k["step_ms"] / off["step_ms"] - 1.0 for k, off in zip(keel_runs, off_runs))
        if off_runs and name == EXTRAS_CONFIG:
            on_ms = statistics.median(k["step_ms"] for k in keel_runs)
            off_ms = statistics.median(k["step_ms"] for k in off_runs)
            # Per pair (adjacent runs), then the median: robust to the machine's drift.
            pair_ratios = [k["step_ms"] / off["step_ms"] - 1.0 for k, off in zip(keel_runs, off_runs)]
            extras["guard"] = {"on_step_ms": on_ms, "off_step_ms": off_ms,
                               "overhead": statistics.median(pair_ratios), "pair_overheads": pair_ratios,
                               "off_runs": off_runs}
            extras["guard_share"] = (sum(k["guard_ms"] for k in keel_runs)
                                     / sum(k["timed_ms"] for k in keel_runs))
            extras["loader_wait_share"] = (sum(k["loader_wait_ms"] for k in keel_runs)
                                           / sum(k["timed_ms"] for k in keel_runs))
            baseline_ms = sum(k["timed_ms"] for k in keel_runs) / (steps * len(keel_runs))
            extras["checkpoint"] = checkpoint_runs(args, shape, warmup, steps, baseline_ms)
            extras["checkpoint_every"] = args.ckpt_every

    update_peak(args)
    meta.update(peak_gflops=PEAK["flops"] / 1e9, peak_how=PEAK["how"],
                peak_samples_gflops=[f / 1e9 for f in PEAK["samples"]])
    for r in results.values():
        r["keel_mfu"] = r["keel_tokens_per_s"] * r["flops_per_token"] / PEAK["flops"]
        r["reference_mfu"] = r["reference_tokens_per_s"] * r["flops_per_token"] / PEAK["flops"]
    print_report(args, meta, results, extras)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "configs": results, **extras}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
