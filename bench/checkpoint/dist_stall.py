#!/usr/bin/env python3
"""The training stall of a checkpoint save, sync against async, with several ranks (issue 50).

    python3 bench/checkpoint/dist_stall.py --keel build/keel [--steps 24] [--out FILE.md]

For 2 and 4 ranks (`keel launch`, Gloo on this machine) under ZeRO-1 and ZeRO-3, one run with
`checkpoint.async: false` and one with `true`, a save every 4 steps: the median `stall_s` of the
`checkpoint` events (how long the save held training up: sync, the whole write; async, the copy to
host memory and any wait for the previous save), the same runs' step time, and the cadence
`checkpoint.every_steps: auto` picks from the measured stall in a third pair of runs (100,000 steps
long, so that no minimum number of saves caps it, stopped once it has decided). The model is
the tiny config widened (d_model 512, 8 layers: 25M parameters, a 300 MB checkpoint with the
AdamW moments), so that a save costs several steps' time on this machine.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

MODEL = ("--set model.d_model=512 --set model.n_layers=8 --set model.n_heads=8 "
         "--set data.micro_batch_size=4 --set logging.progress=off --set eval.every_steps=0 "
         "--set schedule.warmup_steps=2")


def cadence_of(cmd, run_dir):
    """Starts a long run, waits for its checkpoint_cadence decision and stops it (SIGTERM): the
    cadence `auto` picks for a long run, which a short one would cap at its minimum of saves."""
    proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    events = os.path.join(run_dir, "events.jsonl")
    decision = None
    for _ in range(3000):
        if os.path.exists(events):
            for line in open(events):
                e = json.loads(line)
                if e["kind"] == "checkpoint_cadence":
                    decision = e["detail"]
        if decision or proc.poll() is not None:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()
    return decision


def run(keel, nproc, zero, async_save, steps, every, workdir):
    run_dir = os.path.join(workdir, f"n{nproc}_z{zero}_{'async' if async_save else 'sync'}_{every}")
    cmd = (f"{keel} launch --nproc {nproc} -- train --run-dir {run_dir} {MODEL} "
           f"--set run.max_steps={steps} --set distributed.zero={zero} "
           f"--set checkpoint.async={'true' if async_save else 'false'} "
           f"--set checkpoint.every_steps={every} --set checkpoint.keep_last=2")
    if every == "auto":
        d = cadence_of(cmd, run_dir)
        return {"cadence": d["every_steps"] if d else None,
                "overhead": d["overhead"] if d else float("nan")}
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd}\nexited {proc.returncode}:\n{proc.stdout[-3000:]}")
    events = [json.loads(line) for line in open(os.path.join(run_dir, "events.jsonl"))]
    stalls = [e["detail"]["stall_s"] for e in events
              if e["kind"] == "checkpoint" and e["step"] > 0 and "stall_s" in e.get("detail", {})]
    metrics = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    step_ms = statistics.median(m["step_ms"] for m in metrics[2:] or metrics)
    cadence = [e["detail"].get("every_steps") for e in events if e["kind"] == "checkpoint_cadence"]
    return {"stall_s": statistics.median(stalls) if stalls else float("nan"), "saves": len(stalls),
            "step_ms": step_ms, "cadence": cadence[-1] if cadence else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keel", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out")
    args = parser.parse_args()
    keel = os.path.abspath(args.keel)
    rows = ["| ranks | zero | sync stall (s) | async stall (s) | async / sync | step ms sync / async "
            "| auto cadence sync / async (steps) |",
            "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="keel_dist_stall_") as work:
        for nproc in (2, 4):
            for zero in (1, 3):
                sync = run(keel, nproc, zero, False, args.steps, 4, work)
                asyn = run(keel, nproc, zero, True, args.steps, 4, work)
                auto_sync = run(keel, nproc, zero, False, 100000, "auto", work)
                auto_async = run(keel, nproc, zero, True, 100000, "auto", work)
                rows.append(
                    f"| {nproc} | {zero} | {sync['stall_s']:.3f} | {asyn['stall_s']:.3f} | "
                    f"{asyn['stall_s'] / sync['stall_s'] * 100:.1f} % | "
                    f"{sync['step_ms']:.0f} / {asyn['step_ms']:.0f} | "
                    f"{auto_sync['cadence']} / {auto_async['cadence']} |")
                print(rows[-1], flush=True)
    table = "\n".join(rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
