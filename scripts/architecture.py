#!/usr/bin/env python3
"""architecture.py - draw docs/architecture.svg from the workspace itself.

The picture in README's "Architecture and layout" is made from `cargo metadata`, not by hand, so
it cannot drift from the crates: one box per workspace crate (its name, its binaries and its
Cargo description), one arrow per normal dependency between workspace crates, rows by depth
(binaries' crates on top, the pure crates at the bottom). A crate is drawn green when nothing it
pulls in, directly or not, is one of HEAVY: those build without clang, libibverbs, an async
runtime or TLS.

Usage:
  scripts/architecture.py            write docs/architecture.svg
  scripts/architecture.py --check    exit 1 if docs/architecture.svg is not what it would write
                                     (scripts/test.sh runs this)
"""
import html
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "architecture.svg"
# What makes a crate heavy to build or to embed (the same list scripts/test.sh keeps out of the
# pure crates).
HEAVY = {"aya", "aya-obj", "tokio", "rustls", "ring", "sideway", "rdma-mummy-sys"}
# Test-only crates are not part of the architecture a user builds on.
SKIP = {"secure-rdma-tests"}

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN, TOP = 200, 96, 16, 70, 20, 80
BLUE, YELLOW, GREEN = "#dbeafe", "#fde68a", "#bbf7d0"


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def graph(meta):
    """Workspace crates: name -> (description, bins, is_lib, deps on workspace crates, heavy)."""
    ws = set(meta["workspace_members"])
    pkgs = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    names = {pkgs[i]["name"] for i in ws} - SKIP

    def normal(node):
        for d in node["deps"]:
            if any(k["kind"] in (None, "normal") for k in d["dep_kinds"]):
                yield d["pkg"]

    heavy_cache = {}

    def heavy(pid, seen=()):
        if pid in heavy_cache:
            return heavy_cache[pid]
        if pkgs[pid]["name"] in HEAVY:
            return True
        result = any(heavy(d, seen + (pid,)) for d in normal(nodes[pid]) if d not in seen)
        heavy_cache[pid] = result
        return result

    crates = {}
    for pid in ws:
        p = pkgs[pid]
        if p["name"] not in names:
            continue
        bins = sorted(t["name"] for t in p["targets"] if "bin" in t["kind"])
        is_lib = any(k in t["kind"] for t in p["targets"] for k in ("lib", "rlib", "cdylib"))
        deps = sorted({pkgs[d]["name"] for d in normal(nodes[pid])} & names)
        crates[p["name"]] = (p.get("description") or "", bins, is_lib, deps, heavy(pid))
    return crates


DUMMY_W = 24


def rows(crates):
    """Rows of slots, deepest crates on top. Depth = longest path down to a crate with no
    workspace dependency. An edge that skips rows gets a thin slot (a tuple) in each row it
    crosses, so it is routed through a gap between boxes, never behind one (Sugiyama)."""
    depth = {}

    def d(name):
        if name not in depth:
            depth[name] = 1 + max((d(x) for x in crates[name][3]), default=-1)
        return depth[name]

    for name in crates:
        d(name)
    top = max(depth.values())
    row_of = {name: top - depth[name] for name in crates}
    layered = [[] for _ in range(top + 1)]
    for name in sorted(crates):
        layered[row_of[name]].append(name)
    # Every edge as a chain of slots: its crate, a dummy per crossed row, its dependency.
    chains = []
    for name in sorted(crates):
        for dep in crates[name][3]:
            chain = [name] + [(name, dep, r) for r in range(row_of[name] + 1, row_of[dep])] + [dep]
            for slot in chain[1:-1]:
                layered[slot[2]].append(slot)
            chains.append(chain)
    links = [(a, b) for chain in chains for a, b in zip(chain, chain[1:])]
    # Fewer crossings: a few sweeps ordering each row by the mean position of its neighbours
    # in the row above, then below (the barycentre heuristic); ties keep their order.
    for _ in range(6):
        for i in range(1, len(layered)):
            layered[i] = _by_barycentre(layered[i], layered, links, up=True)
        for i in range(len(layered) - 2, -1, -1):
            layered[i] = _by_barycentre(layered[i], layered, links, up=False)
    return layered, chains


def _by_barycentre(row, layered, links, up):
    index = {n: j for r in layered for j, n in enumerate(r)}

    def centre(slot):
        near = [index[a] for a, b in links if b == slot] if up else \
            [index[b] for a, b in links if a == slot]
        return sum(near) / len(near) if near else index[slot]

    return sorted(row, key=lambda n: (centre(n), index[n]))


def _w(slot):
    return DUMMY_W if isinstance(slot, tuple) else BOX_W


def svg(crates):
    layered, chains = rows(crates)
    row_w = [sum(_w(s) + GAP_X for s in r) - GAP_X for r in layered]
    width = max(1000, MARGIN * 2 + max(row_w))
    height = TOP + len(layered) * (BOX_H + GAP_Y) - GAP_Y + 40
    # (x of the slot's centre, y of its top)
    pos = {}
    for i, row in enumerate(layered):
        x = (width - row_w[i]) / 2
        for slot in row:
            pos[slot] = (x + _w(slot) / 2, TOP + i * (BOX_H + GAP_Y))
            x += _w(slot) + GAP_X
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'viewBox="0 0 {width:.0f} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        '<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
        '<path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="20" y="28" font-size="18" font-weight="bold">secure-rdma: the workspace\'s crates '
        'and their dependencies</text>',
        '<text x="20" y="46" font-size="12">Made by scripts/architecture.py from cargo metadata. '
        'Arrow: depends on (normal dependencies, default features).</text>',
        '<text x="20" y="60" font-size="12">Blue: binaries only; yellow: libraries; green: '
        'libraries that build without aya, tokio, rustls, ring or verbs.</text>',
    ]
    # Ports: the edges leaving a box spread along its bottom edge, those arriving along its
    # top, each in the order of the other end's x, so arrowheads do not pile up.
    outs, ins = {}, {}
    for chain in chains:
        outs.setdefault(chain[0], []).append(chain)
        ins.setdefault(chain[-1], []).append(chain)

    def port(slot, group, chain, key):
        group = sorted(group, key=key)
        k = group.index(chain)
        return pos[slot][0] - BOX_W / 2 + BOX_W * (k + 1) / (len(group) + 1)

    for chain in chains:
        src, dst = chain[0], chain[-1]
        pts = [(port(src, outs[src], chain, lambda c: pos[c[1]][0]), pos[src][1] + BOX_H)]
        for slot in chain[1:-1]:
            x, y = pos[slot]
            pts += [(x, y), (x, y + BOX_H)]
        pts.append((port(dst, ins[dst], chain, lambda c: pos[c[-2]][0]), pos[dst][1]))
        path = f"M{pts[0][0]:.0f},{pts[0][1]}"
        for (x1, y1), (x2, y2) in zip(pts, pts[1:]):
            if x1 == x2:
                path += f" L{x2:.0f},{y2}"
            else:
                my = (y1 + y2) / 2
                path += f" C{x1:.0f},{my:.0f} {x2:.0f},{my:.0f} {x2:.0f},{y2}"
        out.append(f'<path d="{path}" fill="none" stroke="#555" stroke-opacity="0.8" '
                   f'stroke-width="1.2" marker-end="url(#a)"/>')
    for name, (desc, bins, is_lib, _, heavy) in sorted(crates.items()):
        cx, y = pos[name]
        x = cx - BOX_W / 2
        fill = BLUE if not is_lib else (YELLOW if heavy else GREEN)
        out.append(f'<rect x="{x:.0f}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="8" '
                   f'fill="{fill}" stroke="#333" stroke-width="1.5"/>')
        out.append(f'<text x="{cx:.0f}" y="{y + 18}" text-anchor="middle" font-weight="bold" '
                   f'font-size="13">{html.escape(name)}</text>')
        line_y = y + 34
        if bins:
            out.append(f'<text x="{cx:.0f}" y="{line_y}" text-anchor="middle" font-size="11" '
                       f'font-style="italic">bin: {html.escape(", ".join(bins))}</text>')
            line_y += 14
        for line in textwrap.wrap(desc, 36)[: (5 if not bins else 4)]:
            out.append(f'<text x="{cx:.0f}" y="{line_y}" text-anchor="middle" '
                       f'font-size="10">{html.escape(line)}</text>')
            line_y += 12
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if argv[1:] in ([], ["--check"]):
        text = svg(graph(metadata()))
        if argv[1:] == ["--check"]:
            if not OUT.exists() or OUT.read_text() != text:
                print("architecture.py: docs/architecture.svg is out of date with the workspace; "
                      "run scripts/architecture.py and commit the result", file=sys.stderr)
                return 1
            print("architecture.py: docs/architecture.svg matches the workspace")
            return 0
        OUT.write_text(text)
        print(f"architecture.py: wrote {OUT.relative_to(ROOT)}")
        return 0
    print(__doc__, file=sys.stderr if argv[1:] not in (["-h"], ["--help"]) else sys.stdout)
    return 0 if argv[1:] in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
