#!/usr/bin/env python3
"""Folders are layers: every #include must point to the file's own folder or to a folder below.

The layer table is read from docs/architecture.md (section "Layers, bottom up"), so the docs and
the code cannot drift apart: a folder missing from the table, a table row naming no folder, or an
include that reaches up (or sideways) fails this test. CAF may be included only by actors
(`*_actor.*`, `stage_actors.hpp`), `stages/stage_interfaces.hpp` (the stages' typed interfaces),
`stages/message_inspect.hpp`, `stages/stage_specs.hpp` (specs carry actor handles),
`stages/error_category.hpp` (the project's errors as a CAF error category) and the node: the plain classes compile without it.

Some separations are held as rules of their own, checked whatever the table says, so that a row
edited to allow them still fails (FORBIDDEN): the engine core never includes the KV data plane
(`kvtransfer/`); it sees only its `engine/kv_layer_sink.hpp` interface.

Usage: layering_test.py REPO_ROOT
"""
import os
import re
import sys

SOURCE_ENDINGS = ('.cpp', '.hpp', '.cu', '.cuh', '.h')
UNCHECKED = ('tests', 'bench', 'build', 'examples', 'tools', 'config', 'docs', '.git', '.ci', 'cmake')
# (layer, layer it must never include, why): held apart even if the table were changed to allow it.
FORBIDDEN = (
    ('engine', 'kvtransfer', 'the engine sees the KV data plane only through engine/kv_layer_sink.hpp'),
)


def read_layer_table(root):
    text = open(os.path.join(root, 'docs', 'architecture.md'), encoding='utf-8').read()
    section = text.split('## Layers, bottom up', 1)
    if len(section) != 2:
        sys.exit('docs/architecture.md has no section "## Layers, bottom up"')
    allowed = {}
    for line in section[1].split('\n## ', 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) < 3 or not cells[1].startswith('`'):
            continue
        folder = cells[1].strip('`/')
        deps = re.findall(r'`([a-z_/]+)/?`', cells[2])
        allowed[folder] = deps
    if not allowed:
        sys.exit('docs/architecture.md: the layer table has no rows')
    return allowed


def closure(allowed):
    full = {}
    for folder in allowed:
        seen, pending = set(), list(allowed[folder])
        while pending:
            dep = pending.pop()
            if dep in seen:
                continue
            if dep not in allowed:
                sys.exit(f'docs/architecture.md: layer {folder} depends on {dep}, which is not a row')
            seen.add(dep)
            pending.extend(allowed[dep])
        if folder in seen:
            sys.exit(f'docs/architecture.md: layer {folder} depends on itself (a cycle)')
        full[folder] = seen
    return full


def layer_of(path, layers):
    best = None
    for folder in layers:
        if path == folder or path.startswith(folder + '/'):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def may_include_caf(path):
    name = os.path.basename(path)
    return (name.endswith(('_actor.cpp', '_actor.hpp')) or name == 'stage_actors.hpp'
            or path in ('stages/stage_interfaces.hpp', 'stages/message_inspect.hpp', 'stages/stage_specs.hpp',
                        'stages/error_category.hpp')
            or path.startswith('node/'))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    allowed = read_layer_table(root)
    reach = closure(allowed)
    problems = []
    seen_layers = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != '.' and rel_dir.split(os.sep)[0] in UNCHECKED:
            dirnames[:] = []
            continue
        for name in filenames:
            if not name.endswith(SOURCE_ENDINGS):
                continue
            path = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, '/')
            layer = layer_of(path, allowed)
            if layer is None:
                problems.append(f'{path}: its folder is not in the layer table of docs/architecture.md')
                continue
            seen_layers.add(layer)
            with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
                for number, line in enumerate(f, 1):
                    quoted = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if quoted:
                        target = quoted.group(1)
                        target_layer = layer_of(target, allowed)
                        if target_layer is None:
                            problems.append(f'{path}:{number}: includes {target}, outside every layer')
                        elif target_layer != layer and target_layer not in reach[layer]:
                            problems.append(f'{path}:{number}: {layer} includes {target} from {target_layer}, '
                                            f'which is not below it')
                        for low, high, why in FORBIDDEN:
                            if layer == low and target_layer == high:
                                problems.append(f'{path}:{number}: {low}/ must not include {high}/ ({target}): '
                                                f'{why}')
                    elif re.match(r'\s*#\s*include\s+<caf/', line) and not may_include_caf(path):
                        problems.append(f'{path}:{number}: includes CAF; only actors, message_inspect.hpp '
                                        f'and the node may')
    for low, high, _ in FORBIDDEN:
        if high in reach.get(low, ()):
            problems.append(f'docs/architecture.md lets {low} include {high}, which must never happen')
    for layer in allowed:
        if layer not in seen_layers:
            problems.append(f'docs/architecture.md names layer {layer}, but it holds no source file')
    for problem in problems:
        print(problem)
    print(f'layering: {len(seen_layers)} layers, {len(problems)} problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
