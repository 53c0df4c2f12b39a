#!/usr/bin/env python3
"""Function and file length limits for src/ (issue 26): no function body over 80 lines and no file
over 600, except those listed in EXCEPTIONS with the reason they stay long.

A function is found the way a reader finds one in code formatted by clang-format (Google style): a
line at namespace or class scope that ends in `{` and is not a namespace, class, struct, enum,
union or initialiser, with its body counted from that line to the matching `}`. Lambdas and nested
blocks count toward the function that holds them.

usage: check_lengths.py [SRC_DIR]   (exit 1 and a list when something is too long)
"""
import os
import re
import sys

MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600

# path (relative to src/) or "path:function" -> why it stays long.
EXCEPTIONS = {
}

NOT_A_FUNCTION = re.compile(
    r"^\s*(namespace\b|class\b|struct\b|enum\b|union\b|extern\b|template\s*<[^>]*>\s*(class|struct)\b)"
    r"|=\s*\{\s*$|^\s*(static\s+)?(const\s+)?(constexpr\s+)?[\w:<>, ]+\s+\w+\s*\[\]\s*=")


def strip_strings(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//")[0]


def functions(path):
    """(name, first line, lines) of every function defined at namespace or class scope."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    out = []
    depth = 0  # braces of namespaces, classes and structs only, outside any function
    scopes = []  # for each open brace outside functions: True when it opened a function
    in_comment = False
    i = 0
    while i < len(lines):
        raw = lines[i]
        code = raw
        if in_comment:
            if "*/" not in code:
                i += 1
                continue
            code = code.split("*/", 1)[1]
            in_comment = False
        if "/*" in code and "*/" not in code.split("/*", 1)[1]:
            in_comment = True
            code = code.split("/*", 1)[0]
        code = strip_strings(code)
        stripped = code.strip()
        opens_function = (stripped.endswith("{") and "(" in "".join(
            strip_strings(l) for l in lines[max(0, i - 6):i + 1]) and not NOT_A_FUNCTION.search(code)
                          and not stripped.startswith(("if", "for", "while", "switch", "else", "do",
                                                       "try", "catch", "case", "}")))
        if opens_function and all(not s for s in scopes):
            # The body: from this line to the brace that closes it.
            body_depth = 0
            j = i
            while j < len(lines):
                c = strip_strings(lines[j])
                body_depth += c.count("{") - c.count("}")
                if body_depth <= 0 and j > i or (body_depth == 0 and c.count("{")):
                    break
                j += 1
            name_line = i
            while name_line > 0 and "(" not in strip_strings(lines[name_line]):
                name_line -= 1
            m = re.search(r"([\w:~]+(operator\S*)?)\s*\(", strip_strings(lines[name_line]))
            name = m.group(1) if m else "?"
            out.append((name, name_line + 1, j - name_line + 1))
            i = j + 1
            continue
        for ch in code:
            if ch == "{":
                scopes.append(False)
            elif ch == "}" and scopes:
                scopes.pop()
        i += 1
    return out, len(lines)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    problems = []
    used = set()
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".cpp", ".h")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            found, total = functions(path)
            if total > MAX_FILE_LINES:
                if rel in EXCEPTIONS:
                    used.add(rel)
                else:
                    problems.append(f"{rel}: {total} lines (at most {MAX_FILE_LINES})")
            for fn, line, length in found:
                if length <= MAX_FUNCTION_LINES:
                    continue
                key = f"{rel}:{fn}"
                if key in EXCEPTIONS:
                    used.add(key)
                    continue
                problems.append(f"{rel}:{line}: {fn} is {length} lines (at most {MAX_FUNCTION_LINES})")
    for key in sorted(set(EXCEPTIONS) - used):
        problems.append(f"{key}: listed as an exception but within the limits now; remove it")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} length problem(s)")
        sys.exit(1)
    print("lengths: every function and file within the limits")


if __name__ == "__main__":
    main()
