#!/usr/bin/env python3
"""keel prepare --jobs 1 against --jobs N on one corpus: wall time, prepare's own seconds, and
whether the outputs are identical.

The corpus is this machine's man pages as JSONL (each page cut at its .SH sections into documents
of web-page size, with an id field), up to --mb megabytes of text: real text in some 20 languages,
with the duplicates (the same page in several packages and sections) that dedup removes.

  python3 bench/data/prepare_jobs.py --keel build/keel [--jobs 2] [--repeats 3] [--mb 60]
"""
import argparse
import filecmp
import glob
import gzip
import json
import os
import statistics
import subprocess
import tempfile
import time


def write_corpus(path, limit_bytes):
    files = sorted(glob.glob("/usr/share/man/*/man*/*.gz") + glob.glob("/usr/share/man/man*/*.gz"))
    docs = size = 0
    with open(path, "w") as out:
        for f in files:
            try:
                text = gzip.open(f).read().decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            for i, part in enumerate(text.split("\n.SH")):
                if len(part) < 200:
                    continue
                out.write(json.dumps({"id": f"{os.path.basename(f)}#{i}", "text": part}) + "\n")
                docs += 1
                size += len(part)
            if size > limit_bytes:
                return docs, size
    return docs, size


def run(keel, corpus, out, jobs):
    t0 = time.perf_counter()
    subprocess.run([keel, "prepare", "--input", corpus, "--output", out, "--jobs", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "report.json")) as f:
        return wall, json.load(f)["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mb", type=float, default=60)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "man.jsonl")
        docs, size = write_corpus(corpus, a.mb * 1e6)
        print(f"corpus: {docs} documents, {size / 1e6:.1f} MB of text, "
              f"{os.path.getsize(corpus) / 1e6:.1f} MB of JSONL")
        times = {1: [], a.jobs: []}
        for r in range(a.repeats):
            for jobs in (1, a.jobs):
                out = os.path.join(tmp, f"out_{jobs}_{r}")
                times[jobs].append(run(a.keel, corpus, out, jobs))
        one, many = os.path.join(tmp, "out_1_0"), os.path.join(tmp, f"out_{a.jobs}_0")
        same = all(filecmp.cmp(os.path.join(one, n), os.path.join(many, n), shallow=False)
                   for n in os.listdir(one) if n.startswith(("train", "val", "sources")))
        med = {j: (statistics.median(w for w, _ in t), statistics.median(s for _, s in t))
               for j, t in times.items()}
        for j, (wall, own) in med.items():
            print(f"--jobs {j}: {wall:.2f} s wall, {own:.2f} s in prepare (median of {a.repeats})")
        print(f"speed-up: {med[1][0] / med[a.jobs][0]:.2f}x wall, "
              f"{med[1][1] / med[a.jobs][1]:.2f}x in prepare; outputs identical: {same}")


if __name__ == "__main__":
    main()
