#!/usr/bin/env python3
"""Writes what keel's tokenizer.json parity test compares against: tokenizers' own encodings.

In OUT_DIR: three tokenizer.json files that the `tokenizers` package trains and writes itself
(GPT-2-style: ByteLevel with its regex; Llama-3-style: a Split with Llama-3's pattern, then
ByteLevel, ignore_merges; Qwen-style: NFC, cl100k's pattern with possessive quantifiers), the
documents (docs.jsonl: real text from this machine, Debian's fortunes, man pages in several
scripts and package changelogs, plus edge cases: whitespace runs, control characters, NEL, the
special tokens inside text), and each tokenizer's ids per document (expected_NAME.jsonl), encoded
as keel encodes: add_special_tokens=False.

Usage: hf_tokenizer_parity.py OUT_DIR [--docs N]
"""
import argparse
import glob
import gzip
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++"
          r"[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s")
SPECIALS = {"gpt2": ["<|endoftext|>"],
            "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
            "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}


def read_gz(path, limit=200_000):
    try:
        with gzip.open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except (OSError, EOFError):
        return ""


def corpus(n_docs):
    docs = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith((".dat", ".u8")) or os.path.isdir(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        docs += [d for d in text.split("\n%\n") if d.strip()][:60]
    for lang in ("ru", "uk", "ja", "ko", "zh_CN", "zh_TW", "de", "fr", "pl", "tr", "sr"):
        for path in sorted(glob.glob(f"/usr/share/man/{lang}/man1/*.gz"))[:25]:
            docs.append(read_gz(path, 20_000))
    for path in sorted(glob.glob("/usr/share/man/man1/*.gz"))[:80]:
        docs.append(read_gz(path, 20_000))
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))[:80]:
        docs.append(read_gz(path, 20_000))
    docs = [d for d in docs if d]
    edge = ["", " ", "   leading and trailing   ", "tabs\t\tand\n\n\nnewlines\r\n\r\n",
            "control \x00\x01\x07\x1b[31m\x7f chars", "next line\x85here\u2028and\u2029paragraph",
            "no\u00a0break\u202fthin\u3000ideographic", "it's I'LL we'Ve they'RE",
            "digits 1234567 3.14159 ١٢٣ ⅷ", "e\u0301 cafe\u0301 Å Å ﬁ", "emoji 🙂👍🏽 zwj 👩‍💻",
            "<|endoftext|>inside<|endoftext|> text", "<|end_of_text|><|eot_id|>x <|im_start|>y",
            "mixed Кириллица 日本語テキスト 한국어 العربية עברית ελληνικά",
            "a" * 3000, " " * 500 + "x", "!!!" * 400]
    return (edge + docs)[:n_docs]


def train(name, docs, vocab):
    model = models.BPE(ignore_merges=name != "gpt2")
    tok = Tokenizer(model)
    if name == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = LLAMA3 if name == "llama3" else CL100K
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if name == "qwen":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS[name],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--vocab", type=int, default=3000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = corpus(args.docs)
    with open(os.path.join(args.out, "docs.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    for name in SPECIALS:
        tok = train(name, docs[::2], args.vocab)  # half the documents: the rest are unseen
        tok.save(os.path.join(args.out, f"{name}.json"))
        with open(os.path.join(args.out, f"expected_{name}.jsonl"), "w") as f:
            for enc in tok.encode_batch(docs, add_special_tokens=False):
                f.write(json.dumps(enc.ids) + "\n")
    print(f"{len(docs)} documents, {sum(len(d) for d in docs)} characters")


if __name__ == "__main__":
    main()
