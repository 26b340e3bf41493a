#!/usr/bin/env python3
"""Checks that every #include follows the room graph.

A room is a folder with one CMake target (see strata_room in the top-level
CMakeLists.txt). CMake writes the graph to rooms.txt, one room per line:
"<dir> <dep>,<dep>,...". A file belongs to the room whose folder is the
longest prefix of its path; it may include headers of its own room and of
every room its room reaches through DEPS, nothing else. Tests under
tests/<room>/ follow their room's rule; a test directly in tests/<folder>/
(tests/offload/x_test.cc) is an integration test of that folder's rooms and
may include any of them; tests/e2e, tests/testutil and tests/soak may include any room.
No library may include a test header. A few calls that build and pass here
but break on another toolchain are refused too (FORBIDDEN).

  layering_check.py --rooms build/rooms.txt --graph-only   # room and folder loops, unknown deps
  layering_check.py --rooms build/rooms.txt --root .       # every #include
  layering_check.py --self-test                            # the checker catches violations
  layering_check.py --rooms build/rooms.txt --doc docs/ARCHITECTURE.md [--write-doc]
                                                           # the doc's room graph is this one
"""

import argparse
import os
import re
import sys
import tempfile

SOURCE_TOP = ("base", "offload", "policies", "rewards", "services", "bench", "tests")
GENERATED = {"strata/v1/": "proto", "grpc/health/": "proto"}
UNRESTRICTED_TESTS = ("tests/e2e", "tests/testutil", "tests/soak")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_rooms(path):
    rooms = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            deps = [d for d in (parts[1].split(",") if len(parts) > 1 else []) if d]
            rooms[parts[0]] = deps
    return rooms


def read_torch_rooms(path):
    """The rooms that reach libtorch: rooms.txt's "# torch: ..." line."""
    with open(path) as f:
        for line in f:
            if line.startswith("# torch:"):
                return set(line.split()[2:])
    return set()


DOC_BEGIN = "<!-- rooms: generated from build/rooms.txt by tests/layering_check.py --write-doc -->"
DOC_END = "<!-- rooms: end -->"


def render_rooms(rooms, torch_rooms):
    """The room graph as docs/ARCHITECTURE.md shows it: top (the CLI) first."""
    width = max(len(r) for r in rooms) + 1
    lines = ["```"]
    for room in reversed(list(rooms)):
        deps = [d for d in rooms[room] if d != "base"]
        mark = "  [torch]" if room in torch_rooms else ""
        uses = ", ".join(deps) if deps else ("(nothing)" if room == "base" else "(base)")
        lines.append(f"{room:<{width}}-> {uses}{mark}".rstrip())
    lines.append("```")
    return "\n".join(lines)


def doc_block(text):
    begin, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if begin < 0 or end < begin:
        return None
    return begin + len(DOC_BEGIN), end


def graph_errors(rooms):
    """Unknown dependencies and loops, as messages."""
    errors = []
    for room, deps in rooms.items():
        for dep in deps:
            if dep not in rooms:
                errors.append(f"{room}: depends on unknown room {dep}")
    state = {}  # room -> "visiting" | "done"

    def visit(room, path):
        state[room] = "visiting"
        for dep in rooms.get(room, []):
            if state.get(dep) == "visiting":
                loop = path[path.index(dep):] + [dep] if dep in path else [room, dep]
                errors.append("dependency loop: " + " -> ".join(loop))
            elif dep in rooms and dep not in state:
                visit(dep, path + [dep])
        state[room] = "done"

    for room in sorted(rooms):
        if room not in state:
            visit(room, [room])
    return errors


def folder_errors(rooms):
    """Loops between top-level folders (offload -> policies -> offload), even
    where the rooms themselves form no loop."""
    folders = {}
    for room, deps in rooms.items():
        top = room.split("/")[0]
        folders.setdefault(top, set()).update(d.split("/")[0] for d in deps if d.split("/")[0] != top)
    return [e.replace("dependency loop", "folder loop") for e in graph_errors(
        {f: sorted(d) for f, d in folders.items()}) if "loop" in e]


def closure(rooms):
    reach = {}

    def walk(room):
        if room in reach:
            return reach[room]
        reach[room] = {room}
        for dep in rooms.get(room, []):
            reach[room] |= walk(dep)
        return reach[room]

    for room in rooms:
        walk(room)
    return reach


def room_of(path, rooms):
    """The room whose folder is the longest prefix of `path`, or None."""
    best = None
    for room in rooms:
        if path == room or path.startswith(room + "/"):
            if best is None or len(room) > len(best):
                best = room
    return best


def included_room(header, rooms):
    for prefix, room in GENERATED.items():
        if header.startswith(prefix):
            return room if room in rooms else f"<no room: {header}>"
    top = header.split("/", 1)[0]
    if top not in SOURCE_TOP:
        return None  # a third-party header
    if top == "tests":
        return "tests"
    return room_of(header, rooms) or f"<no room: {header}>"


# Calls that build and pass here but break elsewhere, and what to use.
FORBIDDEN = {
    "std::filesystem::remove_all": "use RemoveTree (base/file.h): PyTorch 2.x's libtorch.so exports a copy "
                                   "of it that jumps to address 0",
}


def check_tree(root, rooms, strict):
    reach = closure(rooms)
    for top in SOURCE_TOP:  # integration tests reach every room of their folder
        reach["integration:" + top] = set().union(
            *(reach[r] for r in rooms if r == top or r.startswith(top + "/")))
    errors, unbuilt = [], []
    checked = 0
    for top in SOURCE_TOP:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel.startswith("tests/"):
                    if rel.startswith(UNRESTRICTED_TESTS):
                        continue
                    inside = rel[len("tests/"):]
                    owner = room_of(inside, rooms)
                    if owner is None and inside.count("/") == 1:
                        owner = "integration:" + inside.split("/")[0]
                    allowed_tests = True
                else:
                    owner = room_of(rel, rooms)
                    allowed_tests = False
                if owner is None:
                    (errors if strict else unbuilt).append(f"{rel}: belongs to no room")
                    continue
                checked += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for call, why in FORBIDDEN.items():
                    if call in text and rel != "base/file.h":
                        errors.append(f"{rel}: calls {call}; {why}")
                for header in INCLUDE.findall(text):
                    target = included_room(header, rooms)
                    if target is None:
                        continue
                    if target == "tests":
                        if not allowed_tests:
                            errors.append(f"{rel}: includes test header {header}")
                        continue
                    if target.startswith("<no room") and not strict:
                        continue  # a room this configuration does not build
                    if target not in reach[owner]:
                        errors.append(f"{rel} ({owner}) includes {header} ({target}), "
                                      f"which {owner} does not depend on")
    return checked, errors, unbuilt


def self_test():
    """The checker must flag an upward include, a loop and a stray file."""
    rooms = {"base": [], "offload/nvme": ["base"], "policies/model": ["offload/nvme", "base"]}
    assert not graph_errors(rooms), graph_errors(rooms)
    assert graph_errors({"a": ["b"], "b": ["a"]}), "a loop went unnoticed"
    assert graph_errors({"a": ["missing"]}), "an unknown dependency went unnoticed"
    assert not folder_errors(rooms), folder_errors(rooms)
    assert folder_errors({"x/a": ["y/b"], "y/b": [], "y/c": ["x/d"], "x/d": []}), "a folder loop went unnoticed"
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("base/log.h", '#include "absl/status/status.h"\n')
        write("offload/nvme/store.h", '#include "base/log.h"\n')
        write("policies/model/llama.h", '#include "offload/nvme/store.h"\n')
        write("tests/offload/nvme/store_test.cc", '#include "tests/testutil/t.h"\n#include "offload/nvme/store.h"\n')
        _, errors, _ = check_tree(root, rooms, strict=True)
        assert not errors, errors
        write("offload/nvme/bad.cc", '#include "policies/model/llama.h"\n')  # upward
        write("base/stray/x.h", "")
        write("policies/other/y.h", "")  # no room
        write("base/uses_test.h", '#include "tests/testutil/t.h"\n')
        write("tests/offload/nvme/up_test.cc", '#include "policies/model/llama.h"\n')
        write("tests/offload/together_test.cc", '#include "offload/nvme/store.h"\n')
        write("tests/offload/too_far_test.cc", '#include "policies/model/llama.h"\n')
        write("offload/nvme/wipe.cc", "void f() { std::filesystem::remove_all(p); }\n")
        _, errors, _ = check_tree(root, rooms, strict=True)
        text = "\n".join(errors)
        for want in ("offload/nvme/bad.cc (offload/nvme) includes policies/model/llama.h",
                     "policies/other/y.h: belongs to no room",
                     "base/uses_test.h: includes test header",
                     "tests/offload/nvme/up_test.cc (offload/nvme) includes policies/model/llama.h",
                     "tests/offload/too_far_test.cc (integration:offload) includes policies/model/llama.h",
                     "offload/nvme/wipe.cc: calls std::filesystem::remove_all"):
            assert want in text, f"missing: {want}\n{text}"
        assert "together_test" not in text, text
    print("layering_check: self-test passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms")
    parser.add_argument("--root")
    parser.add_argument("--graph-only", action="store_true")
    parser.add_argument("--strict", action="store_true", help="a source file outside every room is an error")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--doc", help="check that this file's room graph block is the one rooms.txt gives")
    parser.add_argument("--write-doc", action="store_true", help="with --doc: rewrite the block instead")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return 0
    rooms = read_rooms(args.rooms)
    if args.doc:
        with open(args.doc) as f:
            text = f.read()
        span = doc_block(text)
        if span is None:
            print(f"{args.doc}: no room graph block ({DOC_BEGIN} ... {DOC_END})", file=sys.stderr)
            return 1
        want = "\n" + render_rooms(rooms, read_torch_rooms(args.rooms)) + "\n"
        if args.write_doc:
            with open(args.doc, "w") as f:
                f.write(text[:span[0]] + want + text[span[1]:])
            return 0
        if text[span[0]:span[1]] != want:
            print(f"{args.doc}: the room graph is out of date; run tests/layering_check.py --rooms "
                  f"build/rooms.txt --doc {args.doc} --write-doc. It should read:{want}", file=sys.stderr)
            return 1
        print(f"layering_check: {args.doc} shows the room graph of {len(rooms)} rooms")
        return 0
    errors = graph_errors(rooms) + folder_errors(rooms)
    if errors or args.graph_only:
        for e in errors:
            print(e, file=sys.stderr)
        return 1 if errors else 0
    checked, errors, unbuilt = check_tree(args.root, rooms, args.strict)
    for e in errors:
        print(e, file=sys.stderr)
    if unbuilt:
        print(f"layering_check: {len(unbuilt)} files in rooms this configuration does not build (not checked)")
    print(f"layering_check: {len(rooms)} rooms, {checked} files, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
