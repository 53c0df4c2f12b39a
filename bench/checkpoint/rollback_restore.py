#!/usr/bin/env python3
"""A rollback's restore from the stable snapshot held in host memory against one read from disk.

    python3 bench/checkpoint/rollback_restore.py --keel build/keel [--nproc 1] [--out FILE.md]

The tiny config widened to 25M parameters (d_model 512, 8 layers: a 300 MB checkpoint with the
AdamW moments), trained at lr 3e-4 (the default 3e-3 makes the guard back the schedule off at this
width), an lr spike (x1000 at steps 24-25) that breaks the model so that the guard rolls back
to the stable snapshot; once with `checkpoint.stable.memory_mb` auto (the copy in memory) and once
with 0 (read and verified from the disk). The table gives each rollback event's `restore_s`: the
load (or the copy) and the restore into the model and optimizer. The disk read comes from the page
cache here (the snapshot was written seconds before); a cold read is slower.
"""

import argparse
import json
import os
import subprocess
import tempfile

MODEL = ("--set model.d_model=512 --set model.n_layers=8 --set model.n_heads=8 "
         "--set data.micro_batch_size=4 --set logging.progress=off --set eval.every_steps=0 "
         "--set schedule.warmup_steps=4 --set run.max_steps=40 --set checkpoint.every_steps=10 "
         "--set optim.lr=3e-4 "
         "--set stability.median_window=10 "
         "--set 'faults=[{kind: lr_spike, factor: 1000, at_step: 24, steps: 2}]'")


def rollbacks(keel, nproc, memory_mb, work):
    run_dir = os.path.join(work, f"n{nproc}_{memory_mb}")
    launch = f"{keel} launch --nproc {nproc} -- " if nproc > 1 else f"{keel} "
    cmd = (f"{launch}train --run-dir {run_dir} {MODEL} "
           f"--set checkpoint.stable.memory_mb={memory_mb}")
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd}\nexited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return [e["detail"] for e in map(json.loads, open(os.path.join(run_dir, "events.jsonl")))
            if e["kind"] == "rollback"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keel", required=True)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    keel = os.path.abspath(args.keel)
    rows = ["| ranks | restored from | rollbacks | restore_s (each) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="keel_rollback_restore_") as work:
        for memory_mb in ("auto", 0):
            events = rollbacks(keel, args.nproc, memory_mb, work)
            sources = sorted({e["restored_from"] for e in events})
            rows.append(f"| {args.nproc} | {', '.join(sources)} | {len(events)} | "
                        f"{', '.join('%.3f' % e['restore_s'] for e in events)} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
