#!/usr/bin/env python3
"""module_graph.py - the library's module graph, read off its objects.

Usage: module_graph.py [--files] [--report] BUILD_OBJ_DIR OBJECT...

Every object's defined and undefined global symbols (nm) give an edge from
the object that uses a symbol to the object that defines it. A module is
the folder of the source file (src/core, src/service/client, transports/nng,
...). The modules must form a DAG: a cycle across folders is a design error
(ARCHITECTURE.md, Layout and layering). Exit status 1 when there is one,
printing each cycle's modules and one symbol per edge as evidence.

--files   also print the strongly connected sets of files (a measure of
          the knot, for notes; never fails)
--report  print the module graph's edges, the largest files and the
          longest functions (the note's before/after table); never fails
"""
import os
import re
import subprocess
import sys



def read_symbols(objs):
    """Returns ({symbol: defining object}, {object: set of used symbols})."""
    out = subprocess.run(["nm", "-o", "--no-sort"] + objs, check=True,
                         capture_output=True, text=True).stdout
    defined, used = {}, {o: set() for o in objs}
    for line in out.splitlines():
        path, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[0] == "U":
            used[path].add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCGSVW" and \
                not parts[2].startswith("."):
            defined.setdefault(parts[2], path)
    return defined, used


def module_of(obj, root):
    rel = os.path.relpath(obj, root)
    return os.path.dirname(rel)


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, onstack, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        onstack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    onstack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in onstack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    onstack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def longest_functions(srcs, count):
    """Function lengths by the house brace style: a line that starts a
    function body is '{' alone in column 0, it ends at '}' in column 0."""
    found = []
    for src in srcs:
        try:
            lines = open(src, encoding="utf-8").read().split("\n")
        except OSError:
            continue
        start, name = None, None
        for i, line in enumerate(lines):
            if line == "{" and i > 0:
                start = i
                m = re.match(r"(\w+)\(", lines[i - 1]) or \
                    re.search(r"(\w+)\(", " ".join(lines[max(0, i - 3):i]))
                name = m.group(1) if m else "?"
            elif line.startswith("}") and start is not None:
                found.append((i - start + 1, f"{src}:{name}"))
                start = None
    found.sort(reverse=True)
    return found[:count]


def main(argv):
    files = "--files" in argv
    report = "--report" in argv
    args = [a for a in argv if not a.startswith("--")]
    root, objs = args[0], args[1:]
    defined, used = read_symbols(objs)
    fedges, medges, evidence = {}, {}, {}
    for obj, syms in used.items():
        for sym in syms:
            target = defined.get(sym)
            if target is None or target == obj:
                continue
            fedges.setdefault(obj, set()).add(target)
            a, b = module_of(obj, root), module_of(target, root)
            if a != b:
                medges.setdefault(a, set()).add(b)
                evidence.setdefault((a, b), (obj, target, sym))
    modules = sorted({module_of(o, root) for o in objs})
    cycles = sccs(modules, medges)
    if report:
        print("module edges (user -> provider):")
        for a in modules:
            print(f"  {a} -> {', '.join(sorted(medges.get(a, ()))) or '-'}")
        srcs = [os.path.relpath(o, root)[:-2] + ".c" for o in objs]
        sizes = sorted(((sum(1 for _ in open(s, encoding="utf-8")), s)
                        for s in srcs if os.path.exists(s)), reverse=True)
        print("largest files (lines):")
        for n, s in sizes[:8]:
            print(f"  {n:5d} {s}")
        print("longest functions (lines):")
        for n, f in longest_functions(srcs, 8):
            print(f"  {n:5d} {f}")
    if files or report:
        fcycles = sccs(sorted(objs), fedges)
        total = sum(len(c) for c in fcycles)
        print(f"files in cycles: {total} in {len(fcycles)} sets")
        for c in fcycles:
            mods = sorted({module_of(o, root) for o in c})
            print(f"  {len(c)} files across {len(mods)} folders: "
                  f"{' '.join(mods)}")
    if not cycles:
        print(f"layers: {len(modules)} modules, no cycle across folders")
        return 0
    for comp in cycles:
        print("layers: a cycle across folders: " + " ".join(comp))
        inside = set(comp)
        for a in comp:
            for b in sorted(medges.get(a, ())):
                if b in inside:
                    obj, target, sym = evidence[(a, b)]
                    print(f"  {a} -> {b}: {os.path.relpath(obj, root)} uses "
                          f"{sym} from {os.path.relpath(target, root)}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
