#!/usr/bin/env python3
"""Fuzzes keel's English word splitting for --minhash-scheme datatrove (src/data/datatrove_minhash
.cpp's datatrove_simplify, then src/data/spacy_en_words.cpp) against datatrove's own: simplify_text,
then spaCy's English tokenizer (load_word_tokenizer("en")). Texts mix words, tokenizer exceptions,
numbers with units and currencies, and characters drawn from every symbol, punctuation, mark and
letter category; a text whose words differ is printed.

  bench/data/.venv/bin/python bench/data/spacy_words/parity.py [--seed 0] [--texts 5000]

Needs the bench venv of bench/data/datatrove_minhash.py (spacy==3.8.18) and g++, libutf8proc,
libxxhash and libpcre2 (scripts/setup.sh installs them).
"""
import argparse
import importlib.metadata  # noqa: F401 (datatrove's dependency check needs it imported)
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")


def build(out):
    src = os.path.join(ROOT, "src")
    subprocess.run(["g++", "-std=c++20", "-O2", "-I" + src,
                    "-I" + os.path.join(ROOT, "third_party", "spacy"),
                    os.path.join(HERE, "words.cpp"),
                    os.path.join(src, "data", "datatrove_minhash.cpp"),
                    os.path.join(src, "data", "spacy_en_words.cpp"),
                    os.path.join(src, "data", "hf_regex.cpp"),
                    "-lutf8proc", "-lxxhash", "-lpcre2-8", "-o", out], check=True)


def texts(seed, count):
    import spacy
    rules = list(spacy.blank("en").tokenizer.rules.keys())
    rng = random.Random(seed)
    by_category = {}
    for cp in range(0x20, 0x30000):
        by_category.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    pools = [by_category[k] for k in ("So", "Sc", "Sm", "Sk", "Pd", "Ps", "Pe", "Pi", "Pf", "Po",
                                      "Pc", "Nd", "No", "Nl", "Lm", "Lo", "Ll", "Lu", "Mn", "Mc",
                                      "Zs", "Cf")]
    units = ["km", "m", "gb", "mb", "kg", "g", "%", "°c", "°f", "tb", "in", "ft", "$", "€", "£",
             "¥", "₹", "mph", "km/h"]
    words = ["the", "a", "man", "page", "option", "file", "dont", "cannot", "im", "id", "wed",
             "gonna", "lets", "hes", "its", "ill", "youre", "theyre", "o'clock", "e.g.", "u.s.",
             "‘s", "’s", "'s"]
    out = []
    for _ in range(count):
        toks = []
        for _ in range(rng.randint(5, 40)):
            r = rng.random()
            if r < 0.3:
                toks.append(rng.choice(words))
            elif r < 0.45:
                toks.append(str(rng.randint(0, 999)) + rng.choice(units))
            elif r < 0.55:
                toks.append(rng.choice(rules))
            elif r < 0.85:
                w = rng.choice(words)
                for _ in range(rng.randint(1, 3)):
                    k = rng.randint(0, len(w))
                    w = w[:k] + rng.choice(rng.choice(pools)) + w[k:]
                toks.append(w)
            else:
                toks.append("".join(rng.choice(rng.choice(pools))
                                    for _ in range(rng.randint(1, 4))))
        out.append(rng.choice([" ", "  ", "\n"]).join(toks).replace("\0", " "))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--texts", type=int, default=5000)
    a = ap.parse_args()
    from datatrove.utils.text import simplify_text
    from datatrove.utils.word_tokenizers import load_word_tokenizer
    tokenizer = load_word_tokenizer("en")
    corpus = texts(a.seed, a.texts)
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "words")
        build(binary)
        with open(os.path.join(tmp, "in"), "w", encoding="utf-8", newline="") as f:
            f.write("\0".join(corpus))
        subprocess.run([binary, os.path.join(tmp, "in"), os.path.join(tmp, "out")], check=True)
        with open(os.path.join(tmp, "out"), encoding="utf-8", newline="") as f:
            got = f.read().split("\0")[:-1]
    bad = 0
    for text, line in zip(corpus, got):
        want = tokenizer.word_tokenize(simplify_text(text))
        have = line.split("\x1f") if line else []
        if want != have:
            bad += 1
            print(f"differs: {text!r}\n  spaCy: {want}\n  keel:  {have}")
    print(f"seed {a.seed}: {len(corpus)} texts, {bad} with other words")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
