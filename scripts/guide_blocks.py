"""The shown-output blocks of docs/guide.md and the keel commands it writes.

Shared by scripts/regen_guide.py (runs the blocks' commands and writes their output back) and
scripts/check_guide.py (the suite's check of the guide's commands against each `--help`).

A block whose output keel produces is a fenced block right after a marker comment:

    <!-- regen
    setup: a shell command run first, its output dropped (repeatable)
    run: a command whose output the block shows without the command (repeatable)
    keep: a regex; only matching output lines are kept, each run of others becomes "..."
          (repeatable: a line matching any is kept)
    tail: N       the last N lines are kept as well
    exit: N       the code every shown command must end with (default 0)
    -->

Inside the block, a line starting with `$ ` (and its `\\` continuation lines) is a command that
is run and shown with its output. The rest of the block is output, replaced on every run.
"""

import re
import shlex

MARKER_OPEN = "<!-- regen"
OPTION_KEYS = ("setup", "run", "keep", "tail", "exit")


class GuideError(Exception):
    pass


class Block:
    """One marked output block: its options and where its fenced body sits in the file."""

    def __init__(self, marker_line, options, fence_open, fence_close, body):
        self.marker_line = marker_line  # 0-based index of the `<!-- regen` line
        self.options = options  # key -> list of values
        self.fence_open = fence_open  # index of the opening ``` line
        self.fence_close = fence_close  # index of the closing ``` line
        self.body = body  # lines between the fences

    def commands(self):
        """The `$ ` commands of the body, each as the list of its shown lines."""
        result = []
        current = None
        for line in self.body:
            if line.startswith("$ "):
                current = [line]
                result.append(current)
            elif current is not None and current[-1].endswith("\\"):
                current.append(line)
            else:
                current = None
        return result


def shell_text(shown_lines):
    """A shown command (`$ ` and continuation lines) as the shell text it stands for."""
    text = "\n".join(shown_lines)
    return text[2:] if text.startswith("$ ") else text


def parse(lines, path="docs/guide.md"):
    """Every marked block of the guide, in order; a malformed marker is a GuideError."""
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(MARKER_OPEN):
            i += 1
            continue
        marker = i
        options = {}
        one_line = lines[i].rstrip().endswith("-->")  # `<!-- regen -->`: no options
        i += 1
        while not one_line and i < len(lines) and lines[i].strip() != "-->":
            line = lines[i].strip()
            key, sep, value = line.partition(":")
            if not sep or key not in OPTION_KEYS:
                raise GuideError(f"{path}:{i + 1}: marker line '{line}': want one of "
                                 f"{', '.join(k + ':' for k in OPTION_KEYS)}")
            options.setdefault(key, []).append(value.strip())
            i += 1
        if i >= len(lines):
            raise GuideError(f"{path}:{marker + 1}: marker not closed with -->")
        if not one_line:
            i += 1
        if i >= len(lines) or not lines[i].startswith("```"):
            raise GuideError(f"{path}:{marker + 1}: a regen marker must be followed at once "
                             f"by a fenced block")
        fence_open = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i >= len(lines):
            raise GuideError(f"{path}:{fence_open + 1}: fenced block not closed")
        for key in ("keep",):
            for pattern in options.get(key, []):
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise GuideError(f"{path}:{marker + 1}: keep: {pattern!r}: {e}")
        blocks.append(Block(marker, options, fence_open, i, lines[fence_open + 1:i]))
        i += 1
    return blocks


def fenced_blocks(lines):
    """(opening line index, info string, body lines) of every fenced block."""
    result = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start = i
            info = lines[i][3:].strip()
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            result.append((start, info, lines[start + 1:i]))
        i += 1
    return result


def split_commands(text):
    """The keel invocations in a shell text: a list of argument lists, each starting at the
    subcommand (`keel launch ... -- train ...` gives the launch and the train it runs)."""
    text = text.replace("\\\n", " ")
    result = []
    for piece in re.split(r"(?:&&|\|\||;|\||\$\()", text):
        try:
            words = shlex.split(piece, comments=True)
        except ValueError:
            continue
        for start, word in enumerate(words):
            if word == "keel" or word.endswith("/keel"):
                args = words[start + 1:]
                if "--" in args and args[:1] == ["launch"]:
                    cut = args.index("--")
                    result.append(args[:cut])
                    result.append(args[cut + 1:])
                else:
                    result.append(args)
                break
    return result
