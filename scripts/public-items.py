#!/usr/bin/env python3
"""Counts the public items of a crate from rustdoc's JSON output (nightly rustdoc).

Walks from the crate root through public modules and re-exports and counts every item a user
can name: modules, types, traits, functions, constants, statics, macros, enum variants, public
fields, and the public items of inherent impls and of the crate's own traits. Trait impls
(derives, From, Display, ...) are not counted: they add no name. Prints the total and the
count per top-level module; `--list` prints every item's path.

Usage: scripts/public-items [--features F] [--list]   (the wrapper runs rustdoc first)
"""
import json
import sys
from collections import Counter

path = sys.argv[1]
listing = "--list" in sys.argv[2:]
d = json.load(open(path))
idx = d["index"]
seen = set()
items = []
named = []  # items without the members (fields, variants, methods)


def public(it):
    return it["visibility"] in ("public", "default")


def add(item_id, path, member=False):
    if item_id in seen:
        return
    seen.add(item_id)
    items.append(path)
    if not member:
        named.append(path)


def walk(item_id, path):
    it = idx.get(str(item_id))
    if it is None:  # an item of another crate, re-exported
        return
    inner = it["inner"]
    kind = next(iter(inner))
    body = inner[kind]
    if kind == "use":
        if body.get("id") is None:
            return
        target = idx.get(str(body["id"]))
        if target is None:
            return
        if body.get("is_glob"):
            walk_module_items(target, path)
            return
        walk(body["id"], path[:-1] + [body["name"]])
        return
    if str(item_id) in seen:
        return
    add(str(item_id), path)
    if kind == "module":
        walk_module_items(it, path)
    elif kind == "struct":
        k = body["kind"]
        fields = []
        if "plain" in k:
            fields = k["plain"]["fields"]
        elif "tuple" in k:
            fields = [f for f in k["tuple"] if f is not None]
        for f in fields:
            fi = idx[str(f)]
            if public(fi):
                add(str(f), path + [fi["name"] or "?"], True)
        impls(body["impls"], path)
    elif kind == "union":
        for f in body["fields"]:
            fi = idx[str(f)]
            if public(fi):
                add(str(f), path + [fi["name"]], True)
        impls(body["impls"], path)
    elif kind == "enum":
        for v in body["variants"]:
            add(str(v), path + [idx[str(v)]["name"]], True)
        impls(body["impls"], path)
    elif kind == "trait":
        for t in body["items"]:
            add(str(t), path + [idx[str(t)]["name"]], True)


def walk_module_items(mod, path):
    for child in mod["inner"]["module"]["items"]:
        ci = idx.get(str(child))
        if ci is None or not public(ci):
            continue
        walk(child, path + [ci["name"] or "?"])


def impls(impl_ids, path):
    for i in impl_ids:
        imp = idx[str(i)]["inner"]["impl"]
        if imp["trait"] is not None or imp.get("is_synthetic") or imp.get("blanket_impl"):
            continue
        for m in imp["items"]:
            mi = idx[str(m)]
            if public(mi):
                add(str(m), path + [mi["name"]], True)


root = idx[str(d["root"])]
walk_module_items(root, [])
per = Counter(p[0] if len(p) > 1 else "<root>" for p in items)
per_named = Counter(p[0] if len(p) > 1 else "<root>" for p in named)
print(f"public items: {len(items)} ({len(named)} without fields, variants and methods)")
for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
    print(f"  {k}: {v} ({per_named[k]})")
if listing:
    for p in sorted("::".join(p) for p in items):
        print(p)
