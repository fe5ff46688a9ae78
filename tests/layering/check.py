#!/usr/bin/env python3
"""The house rules of src/, checked from the code: every project #include points to its own
folder or a floor below (tests/layering/floors.txt), never up and never across to a folder that
shares its floor; no file over 600 lines; no function over 150 lines; communicators come from the
rank mesh (src/parallel/): no other folder makes one or keeps one in a class, but for the places
COMM_ALLOWED names with their reasons; a deck's values are typed where it is read (src/config/):
no code outside config/ compares a deck value with a string.

    check.py [SRC_DIR]     prints one line per breach, FILE:LINE: why, and exits 1 if any

Functions are found by their braces (comments and literals blanked first): a '{' at namespace or
class level that follows a ')' opens a function body; lambdas count toward the function around
them. No dependency beyond Python."""
import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 150
SOURCES = (".cpp", ".hpp", ".cu", ".cuh")
HERE = os.path.dirname(os.path.abspath(__file__))

# Making a communicator: MPI's and NCCL's calls that do.
COMM_MAKER = re.compile(r"\b(MPI_Comm_split(_type)?|MPI_Comm_dup|MPI_Comm_create(_group)?|"
                        r"MPI_Intercomm_create|ncclCommInitRank|ncclCommInitAll|ncclCommSplit)"
                        r"\s*\(")
# A communicator kept as a member of a class or struct (a declaration alone on its line, in a
# header).
COMM_MEMBER = re.compile(r"^\s*MPI_Comm\s+\w+(\s*,\s*\w+)*\s*(=\s*\w+)?\s*;")
# The files outside src/parallel/ that may make or keep a communicator, and why the mesh cannot
# give them theirs.
COMM_ALLOWED = {
    "device/select.cpp": "the ranks of a node (MPI_Comm_split_type) choose their GPUs before any "
                         "layout, so before the mesh, exists",
    "device/emu/": "the CUDA emulator implements NCCL's own calls",
    "train/async_writer.cpp": "a private duplicate of the world for the checkpoint thread "
                              "(collectives from two threads on one communicator are undefined)",
    "train/async_writer.hpp": "the same duplicate, kept by its writer",
    "train/run.hpp": "the world the run is given, which the mesh is built over",
}
# A deck value compared with a string: cfg.device.precision == "bf16".
DECK_STRING = re.compile(r"\b\w+\s*\.\s*(model|data|train|optim|eval|checkpoint|log|run|"
                         r"device|parallel)\s*\.\s*\w+\s*[!=]=\s*\"")


def read_floors(path):
    floors, apart = {}, []
    level = 0
    for line in open(path):
        words = line.split("#")[0].split()
        if not words:
            continue
        if words[0] == "apart":
            apart.append(words[1:])
            continue
        level += 1
        for folder in words:
            floors[folder] = level
    return floors, apart


def room(rel, floors):
    """The folder of src/ a path (relative to src/) stands in: its first component, or the file."""
    top = rel.split("/")[0]
    return top if top in floors else None


def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(first line, last line) of every function body at namespace or class level."""
    code = blank_comments_and_literals(text)
    code = re.sub(r"^[ \t]*#.*$", lambda m: " " * len(m.group(0)), code, flags=re.M)
    stack, found = [], []  # stack of (kind, start line)
    line, statement_start, last = 1, 1, ""
    head = []  # the text since the last ; { or }
    for c in code:
        if c == "\n":
            line += 1
        if c == "{":
            before = "".join(head).strip()
            inside_function = any(kind == "function" for kind, _ in stack)
            kind = "block"
            if not inside_function:
                if re.search(r"\b(namespace|extern)\b", before) or before == "":
                    kind = "namespace" if "namespace" in before or "extern" in before else "block"
                elif re.search(r"\b(class|struct|union|enum)\b", before) and "(" not in before:
                    kind = "class"
                elif re.search(r"\)\s*(const|override|final|noexcept|mutable|->[^{]*|\s)*$",
                               before) or re.search(r"\)\s*:\s*.*\)\s*$", before, re.S):
                    kind = "function"
            stack.append((kind, statement_start))
            head = []
            statement_start = line
        elif c == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "function":
                    found.append((start, line))
            head = []
            statement_start = line
        elif c == ";":
            head = []
            statement_start = line
        else:
            if not head and not c.isspace():
                statement_start = line
            if head or not c.isspace():
                head.append(c)
    return found


def check(src):
    floors, apart = read_floors(os.path.join(HERE, "floors.txt"))
    problems = []
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for dirpath, _, names in os.walk(src):
        for name in sorted(names):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            here = room(rel, floors)
            text = open(path, encoding="utf-8", errors="replace").read()
            lines = text.split("\n")
            if len(lines) - (lines[-1] == "") > MAX_FILE_LINES:
                problems.append(f"{path}:1: {len(lines) - 1} lines, more than {MAX_FILE_LINES}: "
                                "split it along its responsibilities")
            for number, line in enumerate(lines, 1):
                m = include.match(line)
                if not m or here is None:
                    continue
                target = m.group(1)
                there = room(target, floors)
                if there is None or there == here:
                    for group in apart:
                        mine = [g for g in group if rel.startswith(g + "/")]
                        theirs = [g for g in group if target.startswith(g + "/")]
                        if mine and theirs and mine != theirs:
                            problems.append(f"{path}:{number}: includes {target}: {mine[0]} and "
                                            f"{theirs[0]} stay apart (tests/layering/floors.txt)")
                    continue
                if floors[there] > floors[here]:
                    problems.append(f"{path}:{number}: includes {target}: {here} (floor "
                                    f"{floors[here]}) points up to {there} (floor "
                                    f"{floors[there]})")
                elif floors[there] == floors[here]:
                    problems.append(f"{path}:{number}: includes {target}: {here} and {there} "
                                    "share a floor and stay apart")
            code = blank_comments_and_literals(text).split("\n")
            comm_ok = rel.startswith("parallel/") or any(rel.startswith(a) for a in COMM_ALLOWED)
            for number, (line, raw) in enumerate(zip(code, lines), 1):
                if not comm_ok and COMM_MAKER.search(line):
                    problems.append(f"{path}:{number}: makes a communicator: take the group from "
                                    "the mesh (src/parallel/mesh.hpp)")
                if not comm_ok and rel.endswith(".hpp") and COMM_MEMBER.match(line):
                    problems.append(f"{path}:{number}: keeps an MPI_Comm: keep the mesh (or the "
                                    "backend's communicator made from its group)")
                if not rel.startswith("config/") and DECK_STRING.search(raw):
                    problems.append(f"{path}:{number}: compares a deck value with a string: type "
                                    "it where the deck is read (src/config/)")
            for first, last in functions(text):
                if last - first + 1 > MAX_FUNCTION_LINES:
                    problems.append(f"{path}:{first}: a function of {last - first + 1} lines, more "
                                    f"than {MAX_FUNCTION_LINES}: give its parts names of their own")
    return problems


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "src")
    problems = check(src)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} problem{'s' if len(problems) > 1 else ''} in {src}")
        return 1
    print(f"layering: every include of {src} points down a floor, no file over "
          f"{MAX_FILE_LINES} lines, no function over {MAX_FUNCTION_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
