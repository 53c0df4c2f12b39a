#!/usr/bin/env python3
"""Every example in `keel SUBCOMMAND --help` runs as shown (issue 32).

For one subcommand: its help must end with one "Examples:" heading followed by nothing but
example lines; each example then runs, word for word, in a scratch directory that holds a copy of
configs/ (the models shrunk so that a run takes seconds: "tiny steps"), a small raw corpus the
prepare examples name, and whatever earlier commands a walk through the guide would have left
(prepared data, a trained run). Every example must exit 0.

usage: help_examples_test.py KEEL SOURCE_DIR WORK_DIR SUBCOMMAND
"""
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

FORTUNES = "/usr/share/games/fortunes"


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def examples_of(keel, sub):
    out = subprocess.run([keel, sub, "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"keel {sub} --help exited {out.returncode}: {out.stderr}")
    lines = out.stdout.rstrip("\n").split("\n")
    headings = [i for i, line in enumerate(lines) if line.strip() == "Examples:"]
    if len(headings) != 1:
        fail(f"keel {sub} --help: expected one 'Examples:' heading, found {len(headings)}")
    examples = []
    for line in lines[headings[0] + 1:]:
        if not line.strip():
            continue
        if not line.startswith("  keel "):
            fail(f"keel {sub} --help: after 'Examples:' only examples may follow, got: {line!r}")
        command = line.strip()
        # A trailing "# comment" explains the example; it is not part of the command.
        command = re.sub(r"\s+#\s.*$", "", command)
        examples.append(command)
    if not examples:
        fail(f"keel {sub} --help: no examples under 'Examples:'")
    return examples


def shrink(path, max_steps=None):
    """A config's model and batch made tiny, so that a step takes milliseconds on one core."""
    with open(path) as f:
        cfg = yaml.safe_load(f)
    run = cfg.setdefault("run", {})
    run["device"] = "cpu"
    run["precision"] = "fp32"
    if max_steps is not None:
        run["max_steps"] = max_steps
    model = cfg.setdefault("model", {})
    model.update({"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 32})
    if "n_kv_heads" in model:
        model["n_kv_heads"] = 2
    if "d_ff" in model:
        model["d_ff"] = 64
    if cfg.get("data", {}).get("source", "synthetic") == "synthetic":
        model["vocab_size"] = 256
    data = cfg.setdefault("data", {})
    data["micro_batch_size"] = 2
    data["grad_accum_steps"] = 1
    schedule = cfg.setdefault("schedule", {})
    steps = run.get("max_steps", 400)
    if isinstance(schedule.get("warmup_steps"), int):
        schedule["warmup_steps"] = min(schedule["warmup_steps"], max(steps // 10, 1))
    ev = cfg.setdefault("eval", {})
    ev["batches"] = 2
    if isinstance(ev.get("every_steps"), int) and ev["every_steps"] > steps:
        ev["every_steps"] = steps
    if isinstance(cfg.get("checkpoint", {}).get("every_steps"), int):
        cfg["checkpoint"]["every_steps"] = "auto"
        cfg["checkpoint"].pop("stable", None)
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


def fortunes():
    """Every fortune of the Debian corpus, in file order."""
    docs = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if "." in name or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            docs += [d.strip() for d in f.read().split("\n%\n") if d.strip()]
    return docs


def scratch_for(source, work, sub):
    scratch = os.path.join(work, sub)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    shutil.copytree(os.path.join(source, "configs"), os.path.join(scratch, "configs"))
    shrink(os.path.join(scratch, "configs", "tiny.yaml"))
    shrink(os.path.join(scratch, "configs", "fortunes.yaml"), max_steps=30)
    shrink(os.path.join(scratch, "configs", "gpt2-124m.yaml"), max_steps=20)
    docs = fortunes()
    # corpus/: plain text, one document per file; dumps/: JSONL compressed with zstd.
    os.makedirs(os.path.join(scratch, "corpus"))
    for i, doc in enumerate(docs[:600]):
        with open(os.path.join(scratch, "corpus", f"doc{i:04d}.txt"), "w") as f:
            f.write(doc + "\n")
    os.makedirs(os.path.join(scratch, "dumps"))
    half = len(docs) // 2
    for part, chunk in (("a", docs[:half]), ("b", docs[half:])):
        raw = "".join(json.dumps({"text": d}) + "\n" for d in chunk).encode()
        jsonl = os.path.join(scratch, "dumps", f"{part}.jsonl")
        with open(jsonl, "wb") as f:
            f.write(raw)
        subprocess.run(["zstd", "-q", "--rm", jsonl], check=True)
    return scratch


def run(keel, scratch, command, what):
    words = shlex.split(command)
    assert words[0] == "keel"
    print(f"$ {command}", flush=True)
    out = subprocess.run([keel] + words[1:], cwd=scratch, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-3000:]
        fail(f"{what} `{command}` exited {out.returncode}:\n{tail}")


# What a reader of the guide would have done before reaching each subcommand's examples.
SETUP = {
    "prepare": [],
    "validate": [],
    "train": [
        "keel prepare --input " + FORTUNES + " --output data/fortunes --separator % "
        "--cluster source --seq-len 256 --val-fraction 0.05",
    ],
    "launch": [],
    "inspect": ["keel train configs/tiny.yaml --run-dir runs/tiny"],
    "report": ["keel train configs/tiny.yaml --run-dir runs/tiny"],
    "export": ["keel train configs/tiny.yaml --run-dir runs/tiny"],
    "sample": [
        "keel train configs/tiny.yaml --run-dir runs/tiny",
        "keel prepare --input " + FORTUNES + " --output data/fortunes --separator % "
        "--cluster source --seq-len 256 --val-fraction 0.05",
        "keel train configs/fortunes.yaml --run-dir runs/fortunes",
    ],
}


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        sys.exit(2)
    keel, source, work, sub = sys.argv[1:]
    keel = os.path.abspath(keel)
    if not os.path.isdir(FORTUNES):
        print(f"skipped: {FORTUNES} is missing (apt-get install fortunes)")
        sys.exit(77)
    examples = examples_of(keel, sub)
    scratch = scratch_for(os.path.abspath(source), os.path.abspath(work), sub)
    for command in SETUP[sub]:
        run(keel, scratch, command, "setup")
    for command in examples:
        run(keel, scratch, command, "example")
    print(f"keel {sub}: {len(examples)} example(s) ran")


if __name__ == "__main__":
    main()
