#!/usr/bin/env python3
"""Compile every C++ snippet of the docs: README.md, docs/*.md and the `///` comments
of include/ferry/**/*.hpp and *.cuh.

A snippet is a fenced ```cpp block (in a header: inside `///` comment lines), or an
@code ... @endcode block of a header comment. Snippets are not compiled one by one
(ferry.hpp alone takes seconds): all the snippets of one context go into one
translation unit, each in a namespace of its own, `snippet_<file>_<n>`, so their names
do not collide. `#line` directives point the compiler's errors at the .md or .hpp line.

How a snippet is compiled is decided by its content, and a marker overrides it: an
HTML comment on the line right before the fence, `<!-- snippet: WORDS -->` (in a
header, `/// <!-- snippet: WORDS -->`; Markdown and Doxygen show neither), WORDS
separated by commas:

  statements  the block is statements: it goes into a function in its namespace.
              The default.
  file        the block is file-scope code (declarations, definitions, a main): it
              goes into its namespace as it is. Default when the block has a main
              function or its first line of code starts a template, struct, class,
              namespace, enum or union.
  members     the block lists a type's members: it goes into a struct in its
              namespace (deriving from doc_members_base, for value_type).
  host        compiled as host C++ (the C++ compiler, -fsyntax-only) after
              tests/doc_snippets/prelude.hpp. The default.
  cuda        compiled by nvcc (-c) after tests/doc_snippets/prelude.cuh. Default when
              the block names CUDA: `<<<`, `__global__`, `cuda::`, `cudaStream`,
              `device_tier`, `stream_scheduler`, `ferry::stream`, `ferry::event`,
              `ferry::device_arena`, `ferry::layer_streamer`, `.cuh`.
  continued   the block goes on from the block before it in the same file (same
              namespace, same context and kind): statements go into a nested block
              of the same function, so they see the earlier block's names.
  given: D1; D2 ...
              declarations the block takes as given, besides the prelude's
              (`given: ferry::kv_cache<> cache; int max_new_tokens`): each becomes
              `extern D;` in the snippet's namespace (a struct, class, using or
              template declaration is written as it is). Must be the last word.
  skip: WHY   not compiled (a deliberate error, say); the rest of the comment is the
              reason, printed in the summary. Must be the last word; keep these rare.

`#include` lines are always moved to the top of the unit (at file scope); a block whose
text names `uring_engine` or `auto_engine` is compiled only when FERRY_HAS_URING is 1.
`<!-- program: NAME -->` (a whole program tests/doc_program.sh also compiles and runs)
counts as `file`. The names a snippet uses without declaring them (a compute stream,
`bytes`, a kernel, `produce(...)`) come from the preludes in tests/doc_snippets/.

usage: doc_snippets.py --root DIR --context host|cuda --work DIR -- COMPILER ARGS...
       doc_snippets.py --root DIR --list
The compiler line gets the generated unit's path appended. Exit 0 when the unit
compiles (or has no snippet), 1 when it does not, 2 on a malformed doc.
"""

import argparse
import os
import re
import subprocess
import sys
import time

MARKER = re.compile(r"^<!--\s*(snippet|program):\s*(.*?)\s*-->$")
CUDA_WORDS = re.compile(
    r"<<<|__global__|__device__|\bcuda::|\bcudaStream|\bcuda[A-Z]\w*\(|\bdevice_tier\b"
    r"|\bstream_scheduler\b|\bferry::stream\b|\bferry::event\b|\.cuh\b"
    r"|\bferry::device_arena\b|\bferry::layer_streamer\b"
)
DECLARATION = re.compile(r"^(template\s*<|struct\s|class\s|namespace\s|enum\s|union\s)")
INCLUDE_LINE = re.compile(r"^\s*#\s*include\b")
MAIN = re.compile(r"\bint\s+main\s*\(")


class DocError(Exception):
    pass


class Snippet:
    def __init__(self, path, line, lines, marker, marker_line):
        self.path = path          # relative to the root, with / separators
        self.line = line          # 1-based line of the first code line
        self.lines = lines        # the code, comment prefixes removed
        self.kind = None          # "file" | "statements" | "members"
        self.context = None       # "host" | "cuda"
        self.skip = None          # the reason, or None
        self.given = []           # declarations the snippet takes as given (extern)
        self.continued = False    # part of the snippet before it in the same file
        self.guard = None         # a macro the snippet needs (FERRY_HAS_URING)
        self.namespace = None
        self.parts = [self]       # a head's parts: itself and its continuations
        self._classify(marker, marker_line)

    def where(self):
        return f"{self.path}:{self.line}"

    def _classify(self, marker, marker_line):
        text = "\n".join(self.lines)
        code = [l for l in self.lines
                if l.strip() and not l.lstrip().startswith("//") and not INCLUDE_LINE.match(l)]
        kind = "file" if MAIN.search(text) or (code and DECLARATION.match(code[0])) else None
        context = "cuda" if CUDA_WORDS.search(text) else None
        self.guard = "FERRY_HAS_URING" if re.search(r"\buring_engine\b|\bauto_engine\b", text) else None
        if marker is not None:
            what, spec = marker
            if what == "program":
                kind = "file"
            else:
                words = spec
                while words.strip():
                    m = re.match(r"\s*(skip|given)\s*:\s*(.*)$", words)
                    if m:
                        if not m.group(2).strip():
                            raise DocError(f"{self.path}:{marker_line}: '{m.group(1)}:' needs its text")
                        if m.group(1) == "skip":
                            self.skip = m.group(2).strip()
                        else:
                            self.given = [d.strip() for d in m.group(2).split(";") if d.strip()]
                        break
                    word, _, words = words.partition(",")
                    word = word.strip()
                    if word in ("file", "statements", "members"):
                        kind = word
                    elif word in ("host", "cuda"):
                        context = word
                    elif word == "continued":
                        self.continued = True
                    elif word:
                        raise DocError(f"{self.path}:{marker_line}: unknown snippet word '{word}' "
                                       "(file, statements, members, host, cuda, continued, "
                                       "given: DECLARATIONS, skip: REASON)")
        self.kind = kind or "statements"
        self.context = context or "host"


def find_marker(prev_lines):
    """The marker on the last non-blank line before a fence, as (what, spec, index)."""
    for index in range(len(prev_lines) - 1, -1, -1):
        text = prev_lines[index].strip()
        if not text:
            continue
        m = MARKER.match(text)
        return ((m.group(1), m.group(2)), index) if m else (None, None)
    return None, None


def markdown_snippets(root, rel):
    lines = read_lines(root, rel)
    out, i = [], 0
    while i < len(lines):
        if re.match(r"^\s*```\s*(cpp|c\+\+)\s*$", lines[i]):
            marker, mline = find_marker(lines[:i])
            indent = len(lines[i]) - len(lines[i].lstrip())
            start, j = i + 1, i + 1
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            if j == len(lines):
                raise DocError(f"{rel}:{i + 1}: a ```cpp block that is never closed")
            code = [l[indent:] if l[:indent].strip() == "" else l for l in lines[start:j]]
            out.append(Snippet(rel, start + 1, code, marker, (mline or 0) + 1))
            i = j + 1
        else:
            i += 1
    return out


COMMENT = re.compile(r"^\s*///(?: ?)(.*)$")


def header_snippets(root, rel):
    lines = read_lines(root, rel)
    out, i = [], 0
    # the text of each line inside a /// comment, None outside
    body = [(m.group(1) if m else None) for m in (COMMENT.match(l) for l in lines)]
    while i < len(lines):
        text = body[i]
        opener = None
        if text is not None:
            if re.match(r"^\s*```\s*(cpp|c\+\+)\s*$", text):
                opener = re.compile(r"^\s*```\s*$")
            elif re.match(r"^\s*@code(\{\.cpp\})?\s*$", text):
                opener = re.compile(r"^\s*@endcode\s*$")
        if opener is None:
            i += 1
            continue
        prev = []
        k = i - 1
        while k >= 0 and body[k] is not None:
            k -= 1
        prev = [b for b in body[k + 1:i]]
        marker, mline = find_marker(prev)
        start, j = i + 1, i + 1
        while j < len(lines) and body[j] is not None and not opener.match(body[j]):
            j += 1
        if j == len(lines) or body[j] is None:
            raise DocError(f"{rel}:{i + 1}: a code block in a comment that is never closed")
        out.append(Snippet(rel, start + 1, body[start:j], marker, k + 2 + (mline or 0)))
        i = j + 1
    return out


def read_lines(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read().split("\n")


def all_snippets(root):
    docs = ["README.md"] + sorted(
        "docs/" + n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    headers = []
    for folder, _, names in os.walk(os.path.join(root, "include", "ferry")):
        for n in names:
            if n.endswith((".hpp", ".cuh")):
                headers.append(os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/"))
    snippets = []
    for rel in docs:
        if os.path.exists(os.path.join(root, rel)):
            snippets += markdown_snippets(root, rel)
    for rel in sorted(headers):
        snippets += header_snippets(root, rel)
    counts = {}
    for s in snippets:
        base = re.sub(r"\W", "_", s.path.split("/")[-1])
        counts[base] = counts.get(base, 0) + 1
        s.namespace = f"snippet_{base}_{counts[base]}"
    heads, previous = [], None
    for s in snippets:
        if s.continued:
            if previous is None or previous.path != s.path:
                raise DocError(f"{s.where()}: 'continued' with no snippet before it in {s.path}")
            head = previous if not previous.continued else previous.head
            s.head = head
            head.parts.append(s)
            s.context, s.kind = head.context, head.kind
            s.skip = s.skip or head.skip
            head.guard = head.guard or s.guard
        else:
            s.head = s
        previous = s
    return snippets


def generate(snippets, context, unit_name):
    """The translation unit's text for the snippets of one context (heads only: each
    brings its continuations)."""
    prelude = "prelude.cuh" if context == "cuda" else "prelude.hpp"
    out = []

    def here():  # the #line that brings the unit's own numbering back
        out.append(f'#line {len(out) + 2} "{unit_name}"')

    out.append("// Generated by tests/doc_snippets.py: the C++ snippets of the docs; do not edit.")
    out.append(f'#include "{prelude}"')
    # the snippets' own #include lines first, at file scope, each where it was written
    for head in snippets:
        for s in head.parts:
            for n, l in enumerate(s.lines):
                if INCLUDE_LINE.match(l):
                    out.append(f'#line {s.line + n} "{s.path}"')
                    out.append(l)
    here()
    for head in snippets:
        out.append(f"// {head.where()} ({head.kind})")
        if head.guard:
            out.append(f"#if {head.guard}")
        out.append(f"namespace {head.namespace} {{")
        for s in head.parts:
            for d in s.given:
                out.append(d + ";" if re.match(r"(struct|class|using|template)\b", d) else f"extern {d};")
        if head.kind == "statements":
            out.append("[[maybe_unused]] inline void snippet_body() {")
        elif head.kind == "members":
            out.append("struct snippet_members : doc_members_base {")
        for n, s in enumerate(p for p in head.parts if not p.skip):
            if n > 0 and head.kind == "statements":
                out.append("{  // a continuation: it sees the names before it, and may declare them again")
            out.append(f'#line {s.line} "{s.path}"')
            for l in s.lines:
                out.append("" if INCLUDE_LINE.match(l) else l)
            here()
        if head.kind == "statements":
            out.append("}" * len([p for p in head.parts if not p.skip]))
        elif head.kind == "members":
            out.append("};")
        out.append(f"}}  // namespace {head.namespace}")
        if head.guard:
            out.append(f"#endif  // {head.guard}")
    return "\n".join(out) + "\n"


def owner_of(snippets, path, line):
    for s in snippets:
        if s.path == path and s.line <= line < s.line + len(s.lines):
            return s
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--context", choices=["host", "cuda"])
    ap.add_argument("--work")
    ap.add_argument("--list", action="store_true", help="list the snippets and how each is compiled")
    ap.add_argument("command", nargs="*", help="the compiler and its arguments (after --)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    try:
        snippets = all_snippets(root)
    except DocError as e:
        print(f"doc_snippets: {e}")
        return 2
    if args.list:
        for s in snippets:
            how = f"skip: {s.skip}" if s.skip else f"{s.context}, {s.kind}"
            how += "" if s.head is s else f", continues {s.head.where()}"
            print(f"{s.where():60} {s.namespace:40} {how}")
        return 0
    if not args.context or not args.work or not args.command:
        ap.error("--context, --work and a compiler command after -- are needed")

    skipped = [s for s in snippets if s.skip]
    mine = [s for s in snippets if not s.skip and s.context == args.context]
    others = [s for s in snippets if not s.skip and s.context != args.context]
    heads = [s for s in mine if s.head is s]
    suffix = ".cu" if args.context == "cuda" else ".cpp"
    os.makedirs(args.work, exist_ok=True)
    unit = os.path.join(args.work, f"doc_snippets_{args.context}{suffix}")
    with open(unit, "w", encoding="utf-8") as f:
        f.write(generate(heads, args.context, unit))

    print(f"doc_snippets: {len(snippets)} snippets: {len(mine)} {args.context}, "
          f"{len(others)} for the other context, {len(skipped)} skipped")
    for s in skipped:
        print(f"  skipped {s.where()}: {s.skip}")
    print(f"doc_snippets: unit {unit} ({args.context}) holds:")
    for s in mine:
        extra = "" if s.head is s else f", continues {s.head.where()}"
        extra += f", only when {s.head.guard}" if s.head.guard else ""
        print(f"  {s.where()} ({s.kind}{extra}) as {s.head.namespace}")
    if not mine:
        return 0
    command = args.command + [unit]
    print("doc_snippets: " + " ".join(command), flush=True)
    began = time.monotonic()
    result = subprocess.run(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    print(result.stdout, end="")
    print(f"doc_snippets: compiled in {time.monotonic() - began:.1f} s, exit {result.returncode}")
    if result.returncode == 0:
        return 0
    failed = {}
    for m in re.finditer(r"^(?:In file included from )?([^\s:()]+)[:(](\d+)", result.stdout, re.M):
        path, line = m.group(1), int(m.group(2))
        path = os.path.relpath(os.path.join(root, path), root).replace(os.sep, "/")
        s = owner_of(mine, path, line)
        if s is not None:
            failed.setdefault(s.where(), []).append(line)
    if failed:
        print("doc_snippets: the snippets that do not compile:")
        for where, lines in failed.items():
            print(f"  {where} (lines {', '.join(str(l) for l in sorted(set(lines)))})")
    else:
        print("doc_snippets: the unit does not compile, and no error names a snippet line "
              "(a prelude, or an error the snippets cause in ferry's headers)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
