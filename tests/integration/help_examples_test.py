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


def set_keys(path, values):
    """Sets `section.key` values in a block-style YAML config (two-space indentation, as keel's
    configs are written), keeping its comments; keys a section lacks are appended to it."""
    with open(path) as f:
        lines = f.read().split("\n")
    out, section, pending = [], None, {}

    def flush():
        for key, value in pending.items():
            out.append(f"  {key}: {value}")
        pending.clear()

    for line in lines:
        top = re.match(r"^([a-z_]+):\s*(#.*)?$", line)
        if top:
            flush()
            section = top.group(1)
            pending.update({k.split(".", 1)[1]: v for k, v in values.items()
                            if k.split(".", 1)[0] == section})
            out.append(line)
            continue
        key = re.match(r"^  ([a-z_]+):(\s*)([^#]*?)(\s*#.*)?$", line)
        if key and section and key.group(1) in pending:
            out.append(f"  {key.group(1)}: {pending.pop(key.group(1))}")
            continue
        if line.strip() == "" and pending:
            flush()
        out.append(line)
    flush()
    with open(path, "w") as f:
        f.write("\n".join(out))


def shrink(path, max_steps=None, synthetic=True, warmup=None):
    """A config's model and batch made tiny, so that a step takes milliseconds on one core."""
    values = {"run.device": "cpu", "run.precision": "fp32", "model.d_model": 32,
              "model.n_layers": 2, "model.n_heads": 2, "model.seq_len": 32,
              "data.micro_batch_size": 2, "data.grad_accum_steps": 1, "eval.batches": 2}
    if max_steps is not None:
        values["run.max_steps"] = max_steps
    if synthetic:
        values["model.vocab_size"] = 256
    if warmup is not None:
        values["schedule.warmup_steps"] = warmup
    with open(path) as f:
        text = f.read()
    if re.search(r"^  d_ff:", text, re.M):
        values["model.d_ff"] = 64
    if re.search(r"^  n_kv_heads:", text, re.M):
        values["model.n_kv_heads"] = 2
    set_keys(path, values)


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
    shrink(os.path.join(scratch, "configs", "fortunes.yaml"), max_steps=30, synthetic=False,
           warmup=3)
    shrink(os.path.join(scratch, "configs", "gpt2-124m.yaml"), max_steps=20, warmup=2)
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
