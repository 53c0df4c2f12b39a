#!/usr/bin/env python3
"""Near-duplicate detection: keel prepare vs datasketch (MinHash + LSH) on the same planted corpus.

Both use word 3-shingles of lower-cased, whitespace-collapsed text, 128 permutations, 16 bands x 8
rows, and a Jaccard threshold of 0.8 checked on the signatures. Ground truth is the exact Jaccard
of each planted copy with its original. Prints one markdown table (docs/benchmarks.md).

  python3 -m venv bench/data/.venv && bench/data/.venv/bin/pip install datasketch
  bench/data/.venv/bin/python bench/data/dedup_bench.py --keel build/keel [--threads 1]
"""
import argparse, json, os, random, struct, subprocess, tempfile, time

def shingles(text, k=3):
    words = " ".join(text.lower().split()).split(" ")
    if len(words) <= k:
        return {" ".join(words)}
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}

def make_corpus(n_base, n_copies, seed):
    rng = random.Random(seed)
    docs, truth = [], []  # truth: (copy index, exact jaccard with its base)
    bases = []
    for _ in range(n_base):
        words = ["w%d" % rng.randrange(20000) for _ in range(rng.randrange(100, 300))]
        bases.append(words)
        docs.append(" ".join(words))
    for _ in range(n_copies):
        b = rng.randrange(n_base)
        words = list(bases[b])
        for _ in range(rng.randrange(1, max(2, len(words) // 5))):
            words[rng.randrange(len(words))] = "x%d" % rng.randrange(10 ** 6)
        docs.append(" ".join(words))
        sa, sb = shingles(docs[b]), shingles(docs[-1])
        truth.append((len(docs) - 1, len(sa & sb) / len(sa | sb)))
    return docs, truth

def score(flagged, truth, n_base):
    hi = [f for i, j in truth if j >= 0.85 for f in [i in flagged]]
    lo = [f for i, j in truth if j < 0.6 for f in [i in flagged]]
    tp = sum(1 for i, j in truth if j >= 0.8 and i in flagged)
    fp = sum(1 for i, j in truth if j < 0.8 and i in flagged) + sum(1 for i in flagged if i < n_base)
    pos = sum(1 for _, j in truth if j >= 0.8)
    return {"recall@>=0.85": sum(hi) / max(len(hi), 1), "fp@<0.6": sum(lo) / max(len(lo), 1),
            "precision@0.8": tp / max(tp + fp, 1), "recall@0.8": tp / max(pos, 1)}

def run_datasketch(docs, threshold):
    from datasketch import MinHash, MinHashLSH
    t0 = time.perf_counter()
    lsh = MinHashLSH(threshold=threshold, num_perm=128, params=(16, 8))
    sigs, flagged = {}, set()
    for i, d in enumerate(docs):
        m = MinHash(num_perm=128, seed=1)
        m.update_batch([s.encode() for s in shingles(d)])
        if any(sigs[c].jaccard(m) >= threshold for c in lsh.query(m)):
            flagged.add(i)
        else:
            lsh.insert(i, m)
            sigs[i] = m
    return flagged, time.perf_counter() - t0

def run_keel(keel, docs, threads, tmp):
    corpus = os.path.join(tmp, "corpus.jsonl")
    with open(corpus, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    out = os.path.join(tmp, "out")
    t0 = time.perf_counter()
    subprocess.run([keel, "prepare", "--input", corpus, "--output", out, "--threads", str(threads),
                    "--no-exact-dedup", "--min-length", "0"], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "train.idx"), "rb") as f:
        data = f.read()
    kept = {struct.unpack_from("<QQII", data, 64 + 24 * r)[1] for r in range((len(data) - 64) // 24)}
    report = json.load(open(os.path.join(out, "report.json")))
    return set(range(len(docs))) - kept, wall, report

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", required=True)
    ap.add_argument("--base", type=int, default=4000)
    ap.add_argument("--copies", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    docs, truth = make_corpus(a.base, a.copies, 7)
    mb = sum(len(d) + 1 for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        kf, kwall, report = run_keel(a.keel, docs, a.threads, tmp)
    rows = [("keel prepare (threads=%d, whole pipeline)" % a.threads, kf, kwall)]
    try:
        df, dwall = run_datasketch(docs, 0.8)
        rows.append(("datasketch 2.0 MinHashLSH (1 thread, dedup only)", df, dwall))
    except ImportError:
        print("datasketch not installed: pip install datasketch")
    print("corpus: %d documents (%d planted copies), %.1f MB" % (len(docs), a.copies, mb))
    print("| implementation | docs/s | MB/s | recall J>=0.85 | false pos. J<0.6 | precision@0.8 | recall@0.8 |")
    print("|---|---|---|---|---|---|---|")
    for name, flagged, wall in rows:
        s = score(flagged, truth, a.base)
        print("| %s | %.0f | %.2f | %.3f | %.4f | %.3f | %.3f |" % (
            name, len(docs) / wall, mb / wall, s["recall@>=0.85"], s["fp@<0.6"],
            s["precision@0.8"], s["recall@0.8"]))

if __name__ == "__main__":
    main()
