#!/usr/bin/env python3
"""keel's tokenizer.json encoder against Hugging Face tokenizers, one thread each, side by side on
the same documents and the same tokenizer.json files (the three the parity test makes: GPT-2-,
Llama-3- and Qwen-style, trained by tokenizers on text from this machine).

  python3 bench/data/tokenizer_bench.py --build build [--repeat 3]

Run it with the venv's python (scripts/setup.sh's, which has tokenizers). Both sides encode every
document once before timing (tokenizers' BPE and keel keep a word cache; a long prepare runs warm),
then --repeat passes. tokenizers runs with TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1,
through encode_batch (no Python call per document). Prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def bench_tokenizers(path, docs, repeat):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    tok.encode_batch(docs, add_special_tokens=False)  # warm-up
    start = time.perf_counter()
    tokens = 0
    for _ in range(repeat):
        tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    seconds = (time.perf_counter() - start) / repeat
    return {"tokens": tokens, "seconds": seconds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    subprocess.run(["cmake", "--build", args.build, "--target", "keel_bench_tokenizer"],
                   check=True, stdout=sys.stderr)
    binary = os.path.join(args.build, "bench", "data", "keel_bench_tokenizer")
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, os.path.join(ROOT, "tests/tools/hf_tokenizer_parity.py"),
                        work], check=True, stdout=sys.stderr)
        docs_path = os.path.join(work, "docs.jsonl")
        with open(docs_path) as f:
            docs = [json.loads(line)["text"] for line in f]
        size = sum(len(d.encode()) for d in docs)
        print(f"{len(docs)} documents, {size / 1e6:.2f} MB of UTF-8, one thread each, "
              f"mean of {args.repeat} warm passes\n")
        print("| tokenizer.json | tokens | tokenizers MB/s | keel MB/s | keel / tokenizers |")
        print("|---|---|---|---|---|")
        for name in ("gpt2", "llama3", "qwen"):
            path = os.path.join(work, f"{name}.json")
            ref = bench_tokenizers(path, docs, args.repeat)
            out = subprocess.run([binary, path, docs_path, "--repeat", str(args.repeat)],
                                 check=True, capture_output=True, text=True).stdout
            keel = json.loads(out.strip().splitlines()[-1])
            assert keel["tokens"] == ref["tokens"], (name, keel["tokens"], ref["tokens"])
            ref_mbs = size / ref["seconds"] / 1e6
            print(f"| {name} | {ref['tokens']} | {ref_mbs:.2f} | {keel['mb_per_s']:.2f} | "
                  f"{keel['mb_per_s'] / ref_mbs:.2f}× |")


if __name__ == "__main__":
    main()
