#!/usr/bin/env python3
"""Prints the file-level import circles in each crate under host/ (issue 43's house rule:
imports run one way, inside a crate as between crates).

A file refers to another file of its crate when its code (not its comments, nor its
`#[cfg(test)]` module) names a path through `crate::`, `super::` or `self::` that reaches that
file's module; each path is resolved to the deepest module file it names. The circles are the
strongly connected groups of that graph with more than one file.

Usage: scripts/circles.py [--check] [--edges CRATE]. Without --check it only prints (the test
command runs it so the circles are in every log); with --check it exits 1 when any crate has
one. --edges CRATE also prints that crate's edges, each with the first path that made it.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host")
PATH = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", re.S)


def modules(src):
    """Each `.rs` file under `src` by its module path (a tuple; `()` is the crate root)."""
    out = {}
    for folder, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[tuple(parts)] = path
    return out


def references(module, path, known):
    """The modules of `known` that `module` (in file `path`) names, with the first path each."""
    with open(path, encoding="utf-8") as f:
        text = TEST_MODULE.sub("", f.read())
    text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))
    found = {}
    for ref in PATH.findall(text):
        parts = ref.split("::")
        if parts[0] == "crate":
            base, parts = [], parts[1:]
        else:
            base = list(module)
            while parts and parts[0] == "super":
                base, parts = base[:-1], parts[1:]
            if parts and parts[0] == "self":
                parts = parts[1:]
        full = base + parts
        target = next(
            (tuple(full[:k]) for k in range(len(full), 0, -1) if tuple(full[:k]) in known), None
        )
        # A file's own module, or one of its ancestors (a child naming its parent's items),
        # is no edge between files.
        if target and target != module[: len(target)]:
            found.setdefault(target, ref)
    return found


def circles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    check = "--check" in sys.argv
    edges_of = sys.argv[sys.argv.index("--edges") + 1] if "--edges" in sys.argv else None
    total = 0
    for crate in sorted(os.listdir(ROOT)):
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        known = modules(src)
        graph = {m: {} for m in known}
        for module, path in known.items():
            graph[module] = references(module, path, known)
        found = circles(graph)
        total += len(found)
        shown = "; ".join(" <-> ".join("/".join(m) or "lib" for m in group) for group in found)
        edges = sum(len(g) for g in graph.values())
        print(f"{crate}: {len(known)} files, {edges} edges, circles: {shown or 'none'}")
        if crate == edges_of:
            for module in sorted(graph):
                for target, ref in sorted(graph[module].items()):
                    print(f"  {'/'.join(module) or 'lib'} -> {'/'.join(target)}: {ref}")
    print(f"file-level import circles under host/: {total}")
    if check and total:
        sys.exit(1)


if __name__ == "__main__":
    main()
