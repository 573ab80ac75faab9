#!/usr/bin/env python3
"""Every file or folder the design documents name exists (issue 24: docs that describe today).

Reads each document given (default: docs/architecture.md) and takes every `backticked` span that
looks like a path: it contains a slash, or ends in a source or document extension. A path is
looked up from the repository root; `../shared/...` from the repository's parent. A bare file
name (`scale_fit.hpp`) may live in any folder of the repository, since the text names the folder
around it. `*` and `{a,b}` patterns must match at least one file. Spans that are not paths
(flags, TOML keys, commands, URLs) are left alone by the shape test, and a span may opt out with
a trailing "(planned)" in the same line where a document names a file that is not written yet.

Usage: docs_paths_test.py REPO_ROOT [DOC ...]   exits 1 listing each missing path and its line.
"""
import glob
import os
import re
import sys

EXTENSIONS = (".hpp", ".cpp", ".h", ".cu", ".cuh", ".md", ".py", ".mjs", ".js", ".toml",
              ".txt", ".sh", ".json", ".cmake")
# A bare name with one of these is a file of this repository; others (`config.json`,
# `nccl.h`) name a model's or a system's files.
OWN_EXTENSIONS = (".hpp", ".cpp", ".cu", ".cuh", ".py", ".mjs", ".sh")
# A path without extension may name a concept's pair of files (`net/bounded_accept`).
STEM_EXTENSIONS = ("", ".hpp", ".cpp", ".cu", ".cuh")
SKIPPED_PREFIXES = ("http://", "https://", "/v1/", "/metrics", "/health", "/debug/",
                    "/tokenize", "/detokenize", "/version", "/proc/", "/tmp/", "/dev/", "/sys/",
                    "text/event-stream", "text/plain", "application/")


def expand_braces(pattern):
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    out = []
    for choice in match.group(1).split(","):
        out.extend(expand_braces(head + choice + tail))
    return out


def looks_like_path(span, top_level):
    if " " in span or span.startswith("-") or "=" in span or "::" in span:
        return False
    if span.startswith(SKIPPED_PREFIXES) or "://" in span or span.startswith((".", "_")):
        return False
    if "/" not in span and not span.endswith(OWN_EXTENSIONS):
        return False
    if span.endswith(EXTENSIONS):
        return True
    # folder-like: letters, digits, _ - . * { } and slashes, with a slash that is not only at the
    # ends of a unit such as "tokens/s"
    if "/" not in span or not re.fullmatch(r"[\w.\-*{},/]+", span):
        return False
    first = span.split("/")[0]
    return first in top_level or first == ".."


def all_files(root):
    names = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", "build", "node_modules")]
        for name in files + dirs:
            names.setdefault(name, []).append(os.path.join(folder, name))
    return names


def exists(root, span, by_name):
    base = os.path.dirname(root) if span.startswith("../") else root
    if span.startswith("../") and not os.path.isdir(os.path.join(base, span[3:].split("/")[0])):
        return True  # a checkout without the shared folder beside it: nothing to check against
    rel = span[3:] if span.startswith("../") else span
    rel = rel.rstrip("/")
    for candidate in expand_braces(rel):
        if "*" in candidate:
            if "/" in candidate:
                if not glob.glob(os.path.join(base, candidate)):
                    return False
            elif not any(re.fullmatch(candidate.replace(".", r"\.").replace("*", ".*"), n)
                         for n in by_name):
                return False
        elif "/" in candidate:
            # from the root, or (inside a section about one folder) the tail of a longer path
            if not any(os.path.exists(os.path.join(base, candidate + ext)) or
                       any(p.endswith("/" + candidate + ext)
                           for p in by_name.get(os.path.basename(candidate + ext), []))
                       for ext in STEM_EXTENSIONS):
                return False
        elif candidate not in by_name:
            return False
    return True


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    docs = sys.argv[2:] or ["docs/architecture.md"]
    top_level = set(os.listdir(root))
    by_name = all_files(root)
    missing = []
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if "(planned)" in line:
                    continue
                for span in re.findall(r"`([^`\n]+)`", line):
                    span = span.strip()
                    if looks_like_path(span, top_level) and not exists(root, span, by_name):
                        missing.append(f"{doc}:{number}: `{span}` names no file")
    for line in missing:
        print(line)
    if missing:
        print(f"{len(missing)} path(s) in the docs name nothing in the repository")
        return 1
    print(f"docs paths: every path named in {', '.join(docs)} exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
