#!/usr/bin/env python3
"""One `keel prepare` against the same corpus prepared as --tasks N parts and a --merge: the wall
time of each, the time N machines would take (the slowest task, then the merge), and whether the
datasets are identical.

The corpus is this machine's man pages as JSONL (bench/data/prepare_jobs.py's, each page cut at
its .SH sections), written as --files files of about equal size so that the tasks get even shares.
Every command runs alone, one after the other, with --jobs 1: a task stands for a machine of one
core, and the one-process run gets the same core.

  python3 bench/data/prepare_parts.py --keel build/keel [--tasks 3] [--files 6] [--mb 60] [--repeats 3]
"""
import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from prepare_jobs import write_corpus


def timed(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def split(corpus, files, out_dir):
    """Cuts the JSONL corpus into `files` files of about equal size, in order."""
    total = os.path.getsize(corpus)
    paths, out, written = [], None, 0
    with open(corpus) as f:
        for line in f:
            if out is None or (written >= total * len(paths) / files and len(paths) < files):
                if out:
                    out.close()
                paths.append(os.path.join(out_dir, f"man_{len(paths):02d}.jsonl"))
                out = open(paths[-1], "w")
            out.write(line)
            written += len(line)
    out.close()
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", required=True)
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--mb", type=float, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "man.jsonl")
        docs, size = write_corpus(corpus, a.mb * 1e6)
        os.makedirs(os.path.join(tmp, "in"))
        split(corpus, a.files, os.path.join(tmp, "in"))
        os.remove(corpus)
        print(f"corpus: {docs} documents, {size / 1e6:.1f} MB of text in {a.files} JSONL files")
        inputs = ["--input", os.path.join(tmp, "in")]
        one, parts, merged = (os.path.join(tmp, n) for n in ("one", "parts", "merged"))
        runs = []
        for _ in range(a.repeats):
            for d in (one, parts, merged):
                shutil.rmtree(d, ignore_errors=True)
            t_one = timed([a.keel, "prepare", *inputs, "--output", one, "--jobs", "1"])
            t_tasks = [timed([a.keel, "prepare", *inputs, "--output", parts, "--jobs", "1",
                              "--task", str(t), "--tasks", str(a.tasks)])
                       for t in range(a.tasks)]
            t_merge = timed([a.keel, "prepare", "--merge", parts, "--output", merged,
                             "--jobs", "1"])
            runs.append((t_one, t_tasks, t_merge))
        t_one = statistics.median(r[0] for r in runs)
        t_tasks = [statistics.median(r[1][t] for r in runs) for t in range(a.tasks)]
        t_merge = statistics.median(r[2] for r in runs)
        same = all(filecmp.cmp(os.path.join(one, n), os.path.join(merged, n), shallow=False)
                   for n in os.listdir(one) if not n.endswith((".json", ".txt")))
        with open(os.path.join(merged, "report.json")) as f:
            report = json.load(f)
        part_mb = sum(os.path.getsize(os.path.join(parts, p, n)) for p in os.listdir(parts)
                      for n in os.listdir(os.path.join(parts, p))) / 1e6
        print(f"medians of {a.repeats} rounds; one process: {t_one:.2f} s")
        print("tasks: " + ", ".join(f"{t:.2f} s" for t in t_tasks) + f" ({part_mb:.0f} MB of parts)")
        print(f"merge: {t_merge:.2f} s ({report['exact_duplicates']} exact and "
              f"{report['near_duplicates']} near duplicates of {report['documents_in']} documents)")
        wall = max(t_tasks) + t_merge
        print(f"{a.tasks} machines: {wall:.2f} s (slowest task + merge), {t_one / wall:.2f}x; "
              f"datasets identical: {same}")


if __name__ == "__main__":
    main()
