#!/usr/bin/env python3
"""Regenerates the output docs/guide.md shows, by running its commands with a built keel.

    scripts/regen_guide.py --keel build/keel            # rewrite docs/guide.md in place

Run it before a release (and after a change to what keel prints): the guide's numbers, file
names and messages are then the binary's, not a memory of an older one. Each marked block
(scripts/guide_blocks.py describes the marker) runs in the guide's order from the repository
root, with `keel` on PATH meaning the given binary; the blocks share the /tmp/guide_* directories
they name, which are removed first. Log timestamps are dropped; every other character is the
command's own. A command that ends with another exit code than its block declares stops the
script, naming the block: an example that no longer works is a failure, not a new output.
About two minutes on the 2-core development machine.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guide_blocks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMESTAMP = re.compile(r"^(\[rank \d+\] )?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ")


def run(command, env, expected_exit, where):
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", timeout=900)
    if expected_exit is not None and proc.returncode != expected_exit:
        sys.exit(f"{where}: `{command}` exited {proc.returncode}, the guide expects "
                 f"{expected_exit}; its output:\n{proc.stdout}")
    return [TIMESTAMP.sub(r"\1", line).expandtabs().rstrip() for line in proc.stdout.splitlines()]


def select(lines, keep, tail):
    """The lines matching a keep pattern (all when there is none) and the last `tail`, each
    run of dropped lines shown as one '...'."""
    if not keep and not tail:
        return lines
    patterns = [re.compile(p) for p in keep]
    first_tail = len(lines) - tail if tail else len(lines)
    shown = []
    for i, line in enumerate(lines):
        if i >= first_tail or any(p.search(line) for p in patterns):
            shown.append(line)
        elif not shown or shown[-1] != "...":
            shown.append("...")
    return shown


def regenerate(block, env, path):
    where = f"{path}:{block.marker_line + 1}"
    options = block.options
    exit_code = int(options.get("exit", ["0"])[0])
    keep = options.get("keep", [])
    tail = int(options.get("tail", ["0"])[0])
    for command in options.get("setup", []):
        run(command, env, 0, where)
    body = []
    for command in options.get("run", []):
        body += select(run(command, env, exit_code, where), keep, tail)
    spaced = any(line == "" for line in block.body)
    for i, shown in enumerate(block.commands()):
        if i > 0 and spaced:
            body.append("")
        body += shown
        output = run(guide_blocks.shell_text(shown), env, exit_code, where)
        body += select(output, keep, tail)
    return body


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keel", required=True, help="the keel binary the output comes from")
    parser.add_argument("--guide", default=os.path.join(ROOT, "docs", "guide.md"))
    args = parser.parse_args()

    with open(args.guide, encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        blocks = guide_blocks.parse(lines, args.guide)
    except guide_blocks.GuideError as e:
        sys.exit(str(e))

    bin_dir = tempfile.mkdtemp(prefix="keel_guide_bin_")
    os.symlink(os.path.abspath(args.keel), os.path.join(bin_dir, "keel"))
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    for old in glob.glob("/tmp/guide_*"):
        shutil.rmtree(old, ignore_errors=True)

    try:
        new_bodies = []
        for block in blocks:
            print(f"block at line {block.marker_line + 1}", file=sys.stderr, flush=True)
            new_bodies.append(regenerate(block, env, args.guide))
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)

    changed = []
    for block, body in reversed(list(zip(blocks, new_bodies))):  # from the end: indexes hold
        if body != block.body:
            changed.append(block.marker_line + 1)
        lines[block.fence_open + 1:block.fence_close] = body
    with open(args.guide, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"{args.guide}: {len(blocks)} block(s) run, {len(changed)} changed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
