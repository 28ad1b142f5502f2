#!/usr/bin/env python3
"""Prints how big the production code under host/ has grown: files over the line limit and
functions over the body limit (issue 43's house rules: no file over 1,500 lines, no production
function over 150). Test code is left out: `tests/`, `benches/` and `examples/` folders, and a
file's `#[cfg(test)]` module from where it opens.

Usage: scripts/sizes.py [--check]. Without --check it only prints (the test command runs it so
the counts are in every log); with --check it exits 1 when anything is over a limit.

Functions are found by a brace count that skips strings, chars and comments: good enough for
rustfmt-formatted code, which is all this repository has (`cargo fmt --check` runs first).
"""

import os
import re
import sys

FILE_LIMIT = 1500
FN_LIMIT = 150
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SKIP_DIRS = {"tests", "benches", "examples", "target", "node_modules"}
FN_START = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def code_only(line, state):
    """The line with strings, chars and comments blanked; `state` carries a block comment or
    a raw/plain string across lines."""
    out = []
    i = 0
    while i < len(line):
        if state["block"]:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["block"] = False
            i = end + 2
            continue
        if state["string"]:
            if line[i] == "\\":
                i += 2
                continue
            if line.startswith(state["string"], i):
                i += len(state["string"])
                state["string"] = None
                continue
            i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        raw = re.match(r'b?r(#*)"', line[i:])
        if raw and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["string"] = '"' + raw.group(1)
            i += raw.end()
            continue
        if c == '"':
            state["string"] = '"'
            i += 1
            continue
        char = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
        if char:
            i += char.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def production_lines(path):
    """The file's lines up to its test module (a `#[cfg(test)]` followed by `mod`)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and n + 1 < len(lines) and re.match(r"\s*(pub\s+)?mod\s", lines[n + 1]):
            return lines, lines[:n]
    return lines, lines


def long_functions(lines):
    """(name, first line, length) of every function longer than FN_LIMIT lines."""
    found = []
    state = {"block": False, "string": None}
    stack = []  # (name, start line, depth at which its body opened)
    depth = 0
    pending = None  # a fn signature seen, its body's brace not yet
    for n, line in enumerate(lines, 1):
        was_in_string = state["string"] is not None or state["block"]
        code = code_only(line, state)
        m = None if was_in_string else FN_START.match(line)
        if m:
            pending = (m.group(7), n)
        for c in code:
            if c == "{":
                depth += 1
                if pending:
                    stack.append((pending[0], pending[1], depth))
                    pending = None
            elif c == "}":
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    length = n - start + 1
                    if length > FN_LIMIT:
                        found.append((name, start, length))
                depth -= 1
            elif c == ";" and pending:
                # A declaration without a body (trait method).
                pending = None
    return found


def main():
    check = "--check" in sys.argv[1:]
    host = os.path.join(ROOT, "host")
    big_files, big_fns, files = [], [], 0
    for dirpath, dirnames, filenames in os.walk(host):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)
            files += 1
            lines, production = production_lines(path)
            if len(lines) > FILE_LIMIT:
                big_files.append((rel, len(lines)))
            for fn, start, length in long_functions(production):
                big_fns.append((rel, fn, start, length))
    print(f"files under host/ over {FILE_LIMIT} lines: {len(big_files)} (of {files})")
    for rel, n in sorted(big_files, key=lambda x: -x[1]):
        print(f"  {rel}: {n} lines")
    print(f"production functions over {FN_LIMIT} lines: {len(big_fns)}")
    for rel, fn, start, length in sorted(big_fns, key=lambda x: -x[3]):
        print(f"  {rel}:{start} {fn}: {length} lines")
    if check and (big_files or big_fns):
        sys.exit(1)


if __name__ == "__main__":
    main()
