#!/usr/bin/env python3
"""keel's MinHash near-dedup against datatrove's (the pipeline FineWeb was deduplicated with) on the
same documents with the same MinHash settings: documents/s per core, and which documents each
removes.

The corpus is this machine's man pages as JSONL (bench/data/prepare_jobs.py's). Both sides use
word 5-grams, 14 buckets (LSH bands) of 8 hashes, datatrove's defaults. datatrove's stages run one
task on one worker: 1 (signatures) is timed; 2 (buckets) and 3 (clusters) give the removed
documents. keel runs `keel prepare --jobs 1` with every other filter off, so that a document is
missing from its shards exactly when dedup removed it; its time covers the whole prepare (reading,
dedup, tokenizing, writing), not the signatures alone.

datatrove's English word tokenizer is spaCy's. keel's own scheme splits words on whitespace, so for
it the bench gives datatrove a whitespace word tokenizer (the `Words` class below); `--words`
chooses. `--scheme datatrove` runs keel with `--minhash-scheme datatrove --no-exact-dedup` (FineWeb's
dedup reproduced, spaCy's English words included; datatrove's stages have no exact pass) against
datatrove with its own English tokenizer: the two must remove the very same documents.

  python3 -m venv bench/data/.venv && bench/data/.venv/bin/pip install datatrove==0.6.0 \
      regex==2026.12.2 xxhash==3.8.2 orjson==3.13.0 tokenizers==0.23.3 spacy==3.8.18
  bench/data/.venv/bin/python bench/data/datatrove_minhash.py --keel build/keel [--mb 60] \
      [--threshold 0.8 | --scheme datatrove] [--words whitespace|spacy] [--simplified]

(xxhash 4 refuses the str that datatrove 0.6.0 hashes, hence 3.8.2.)
"""
import argparse
import json
import os
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_jobs import write_corpus  # noqa: E402


def datatrove_removed(corpus_dir, work, ngrams, buckets, rows, spacy=False):
    """Runs datatrove's stages 1-3; returns (stage 1 seconds, removed document indices). With
    `spacy`, its stage 1 splits words with its own English tokenizer (spaCy's)."""
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets,
                                                  MinhashDedupCluster, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        def word_tokenize(self, text):
            return text.split()

        def sent_tokenize(self, text):
            return [text]

        def span_tokenize(self, text):
            raise NotImplementedError

    config = MinhashConfig(n_grams=ngrams, num_buckets=buckets, hashes_per_bucket=rows)
    reader = JsonlReader(corpus_dir, glob_pattern="*.jsonl", text_key="text", id_key="id")

    def run(step, name, tasks=1):
        executor = LocalPipelineExecutor(pipeline=step, tasks=tasks, workers=1,
                                         logging_dir=os.path.join(work, "logs", name))
        t0 = time.perf_counter()
        executor.run()
        return time.perf_counter() - t0

    seconds = run([reader, MinhashDedupSignature(os.path.join(work, "sigs"), config=config,
                                                 language="en" if spacy else Words())],
                  "sigs")
    run([MinhashDedupBuckets(os.path.join(work, "sigs"), os.path.join(work, "buckets"),
                             config=config)], "buckets", tasks=buckets)
    run([MinhashDedupCluster(os.path.join(work, "buckets"), os.path.join(work, "remove"),
                             config=config)], "cluster")
    removed = set()
    path = os.path.join(work, "remove", "000000.remove")
    if os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
        removed = set(struct.unpack(f"<{len(data) // 4}I", data))
    return seconds, removed


def keel_removed(keel, corpus, out, ngrams, buckets, rows, threshold, scheme):
    """Runs keel prepare with only dedup on; returns (seconds, documents, removed ids, report).
    Under --minhash-scheme datatrove exact dedup is off too: datatrove's MinHash stages are the
    only dedup in the comparison, and exact duplicates are near duplicates to them."""
    import subprocess
    dedup = (["--minhash-scheme", "datatrove", "--no-exact-dedup"] if scheme == "datatrove"
             else ["--dedup-threshold", str(threshold)])
    subprocess.run([keel, "prepare", "--input", corpus, "--output", out, "--jobs", "1"] + dedup +
                   ["--shingle-size", str(ngrams), "--num-perm", str(buckets * rows),
                    "--bands", str(buckets), "--val-fraction", "0",
                    "--drop-percentile-tails", "0", "--max-repeated-share", "0",
                    "--max-top-char-share", "0", "--keep-whole", "0"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    kept = set()
    with open(os.path.join(out, "train.idx"), "rb") as f:
        data = f.read()[64:]  # the FileHeader
    for k in range(len(data) // 24):  # IndexRecord {uint64 offset, uint64 doc_id, uint32, uint32}
        kept.add(struct.unpack_from("<Q", data, 24 * k + 8)[0])
    n = report["documents_in"]
    return report["seconds"], n, set(range(n)) - kept, report


def simplify(corpus):
    """Rewrites the corpus with every text as datatrove's shingler sees it."""
    from datatrove.utils.text import simplify_text
    with open(corpus) as f:
        records = [json.loads(line) for line in f]
    with open(corpus, "w") as f:
        for r in records:
            r["text"] = simplify_text(r["text"])
            f.write(json.dumps(r) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", required=True)
    ap.add_argument("--mb", type=float, default=60)
    ap.add_argument("--ngrams", type=int, default=5)
    ap.add_argument("--buckets", type=int, default=14)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.8,
                    help="keel's --dedup-threshold (0.01: every LSH candidate is a duplicate, "
                         "datatrove's rule)")
    ap.add_argument("--scheme", choices=["keel", "datatrove"], default="keel",
                    help="keel's --minhash-scheme (datatrove: FineWeb's dedup reproduced; "
                         "--threshold does not apply)")
    ap.add_argument("--words", choices=["whitespace", "spacy"],
                    help="datatrove's word tokenizer (default: spacy, its own, with --scheme "
                         "datatrove; whitespace, as keel's own scheme splits, otherwise)")
    ap.add_argument("--simplified", action="store_true",
                    help="give both tools the texts after datatrove's simplify_text (lower case, "
                         "numbers to 0, punctuation to spaces, diacritics stripped)")
    a = ap.parse_args()
    if a.words is None:
        a.words = "spacy" if a.scheme == "datatrove" else "whitespace"
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "in"))
        corpus = os.path.join(tmp, "in", "man.jsonl")
        docs, size = write_corpus(corpus, a.mb * 1e6)
        if a.simplified:
            simplify(corpus)
        print(f"corpus: {docs} documents, {size / 1e6:.1f} MB of text"
              f"{' (simplified)' if a.simplified else ''}; word {a.ngrams}-grams, "
              f"{a.buckets} buckets x {a.rows} hashes; keel "
              + ("--minhash-scheme datatrove --no-exact-dedup" if a.scheme == "datatrove"
                 else f"--dedup-threshold {a.threshold}"))
        k_sec, n, k_removed, report = keel_removed(a.keel, corpus, os.path.join(tmp, "keel"),
                                                   a.ngrams, a.buckets, a.rows, a.threshold,
                                                   a.scheme)
        d_sec, d_removed = datatrove_removed(os.path.join(tmp, "in"), os.path.join(tmp, "dt"),
                                             a.ngrams, a.buckets, a.rows, spacy=a.words == "spacy")
        both = k_removed & d_removed
        print(f"keel prepare --jobs 1: {k_sec:.2f} s, {n / k_sec:,.0f} documents/s "
              f"(whole prepare); removed {len(k_removed)} ({report['exact_duplicates']} exact, "
              f"{report['near_duplicates']} near)")
        print(f"datatrove signatures ({a.words} words), 1 worker: {d_sec:.2f} s, {n / d_sec:,.0f} documents/s; "
              f"removed {len(d_removed)} (stages 2-3)")
        print(f"removed by both: {len(both)}; keel only: {len(k_removed - d_removed)}; "
              f"datatrove only: {len(d_removed - k_removed)}; difference "
              f"{len(k_removed ^ d_removed) / max(len(d_removed), 1):.2%} of datatrove's")


if __name__ == "__main__":
    main()
