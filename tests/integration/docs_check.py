"""The documentation's house rules (tests/integration/test_docs.sh runs this in `make test`).

  docs_check.py [ROOT]

Over README.md, docs/*.md, input/README.md, jobscripts/README.md and tests/fuzz/README.md:
  - every Markdown link and image, [text](target) or ![alt](target), names a file or folder of
    the repository, relative to the page (a web address, http:// or https://, is let through:
    it is a citation, not a page of ours); its #anchor, if any, is a heading of the target page
    (GitHub's spelling: lower case, punctuation dropped, spaces as hyphens);
  - no page points outside the repository: no link, and no path in the text, that leaves the
    checkout (`../shared/DESIGN.md`, `/work/...`, a link that climbs above the root);
  - every path in the text that starts at a top-level folder of the repository (src/, tests/,
    tools/, input/, jobscripts/, docs/, .ci/) names something that exists: a file or folder, or
    a glob that matches one (`src/backend/cuda/*.cu`, `src/model/gpt.*`); a part in capitals
    (`tests/fuzz/corpus/TARGET/`) stands for any name;
  - every page of docs/ is linked from README.md, and README.md is at most 300 lines;
  - every tests/integration/test_*.sh is named in docs/tests.md.
Prints one line per breach, FILE:LINE: what, and exits 1 if there is any; 0 and a summary line
otherwise.
"""
import glob
import os
import re
import sys

PAGES = ["README.md", "docs/*.md", "input/README.md", "jobscripts/README.md", "tests/fuzz/README.md"]
TOP = ("src", "tests", "tools", "input", "jobscripts", "docs", ".ci")
README_MAX_LINES = 300

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
# A path from a top-level folder, in prose, code spans or code blocks alike.
PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w./*+-]*)" % "|".join(re.escape(t) for t in TOP))
OUTSIDE = re.compile(r"(?<![\w.])(\.\./(?:\.\./)*shared/[\w./-]*|/work/[\w./-]*|\.\./\.\./[\w./-]*)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    fenced = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
    return out


def exists(root, rel):
    """A repository path, a glob, or a path with placeholder parts in capitals."""
    rel = rel.rstrip(".,:;")
    parts = [("*" if re.fullmatch(r"[A-Z][A-Z0-9_]*", p) else p) for p in rel.split("/")]
    pattern = os.path.join(root, *[p for p in parts if p])
    if any(c in pattern for c in "*?["):
        return bool(glob.glob(pattern))
    return os.path.exists(pattern)


def inside(root, path):
    root = os.path.realpath(root)
    return os.path.realpath(path) == root or os.path.realpath(path).startswith(root + os.sep)


def check_page(root, page, problems):
    rel_page = os.path.relpath(page, root)
    here = os.path.dirname(page)
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        where = f"{rel_page}:{n}"
        for m in OUTSIDE.finditer(line):
            problems.append(f"{where}: points outside the repository: {m.group(1)}")
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"https?://", target):
                continue
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                problems.append(f"{where}: link {target}: not a page of the repository")
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file_part)) if file_part else page
            if not inside(root, dest):
                problems.append(f"{where}: link {target}: outside the repository")
            elif not os.path.exists(dest):
                problems.append(f"{where}: link {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{where}: link {target}: no heading #{anchor} in "
                                f"{os.path.relpath(dest, root)}")
        for m in PATH.finditer(line):
            path = m.group(1)
            if not exists(root, path):
                problems.append(f"{where}: {path}: no such file or folder in the repository")
    return len(lines)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    problems = []
    pages = sorted({p for pattern in PAGES for p in glob.glob(os.path.join(root, pattern))})
    if not os.path.exists(os.path.join(root, "README.md")):
        problems.append("README.md: missing")
    lines = {}
    for page in pages:
        lines[os.path.relpath(page, root)] = check_page(root, page, problems)
    readme_lines = lines.get("README.md", 0) - 1  # the text after the last newline is no line
    if readme_lines > README_MAX_LINES:
        problems.append(f"README.md: {readme_lines} lines, more than {README_MAX_LINES}")
    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            linked = {os.path.normpath(os.path.join(root, m.group(1).partition("#")[0]))
                      for m in LINK.finditer(f.read())}
        for page in pages:
            rel = os.path.relpath(page, root)
            if rel.startswith("docs" + os.sep) and page not in linked:
                problems.append(f"{rel}: not linked from README.md")
    tests_page = os.path.join(root, "docs", "tests.md")
    if os.path.exists(tests_page):
        with open(tests_page, encoding="utf-8") as f:
            text = f.read()
        for script in sorted(glob.glob(os.path.join(root, "tests", "integration", "test_*.sh"))):
            if f"`{os.path.basename(script)}`" not in text:
                problems.append(f"docs/tests.md: {os.path.relpath(script, root)} is not listed")
    for p in problems:
        print(p)
    if problems:
        print(f"docs_check: {len(problems)} problems in {len(pages)} pages")
        return 1
    print(f"docs_check: {len(pages)} pages, every link and path inside the repository and present; "
          f"README.md {readme_lines} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
