#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md resolves: the file exists and, for
a link into a Markdown file with #anchor, a heading of that file has that GitHub anchor.
Usage: python3 scripts/check_links.py [REPO_DIR]   (exit 1 naming each dead link)"""
import glob
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading):
    # GitHub's rule: lower case, drop what is not a word character, space or hyphen, spaces to '-'.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    found, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def links(path):
    fence = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield n, m.group(1)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    bad = 0
    for f in files:
        for n, target in links(f):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            rel = os.path.relpath(f, root)
            if not os.path.exists(dest):
                print(f"{rel}:{n}: dead link {target!r}: no {os.path.relpath(dest, root)}")
                bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                print(f"{rel}:{n}: dead link {target!r}: no heading #{frag} in {os.path.relpath(dest, root)}")
                bad += 1
    print(f"check_links: {bad} dead link(s) in {len(files)} files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
