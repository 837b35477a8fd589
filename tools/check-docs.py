#!/usr/bin/env python3
"""Checks strata's Markdown pages: every code block is tested, every link and path resolves.

Rules (docs/README.md, "How the pages are kept true", says them for writers):
  * Every fenced block names a language. A ```text block is output or a picture, not code.
  * Above every other block, on the nearest non-blank line, a marker says how it is tested:
      <!-- file: PATH -->          the block is the whole file PATH
      <!-- snippet: PATH#NAME -->  the block is region NAME of PATH: the lines between one holding
                                   `doc-snippet: NAME` and the next holding `doc-snippet-end`,
                                   less their common indentation
      <!-- commands -->            shell commands: each program exists, each --option is one it
                                   takes, each --preset is one of CMakePresets.json
      <!-- ci: test command -->    README's test command (.ci/run runs it); checked as commands
    PATH must be compiled or run by a test: named in a CMakeLists.txt, .ci/run or a ctest
    script, or a Python test file pytest collects.
  * Every relative link (and its #anchor) resolves; every repo path named in `backticks` exists.
  * Every page under docs/ is linked from docs/README.md; README.md has at most --max-readme lines.
  * Every public header (include/strata) opens with a comment: its contract, the API reference.
Exit status 1 and one line per problem (PAGE:LINE: what) when anything fails.

With --refresh the pages' file and snippet blocks are first rewritten from their sources (what a
writer runs after changing a region), then every rule is checked as usual.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

TOP_FOLDERS = {"include", "tests", "examples", "bench", "tools", "docs", "python", "cmake", ".ci"}
HEADER_FOLDERS = {"core", "sync", "optim", "exec", "tier", "policy", "pipeline", "offload"}
# Programs of the system or of other projects: their options are not ours to check.
SYSTEM_PROGRAMS = {
    "apt-get", "bash", "sh", "cat", "cd", "ccache", "cmake", "cp", "ctest", "curl", "echo", "env",
    "eval", "export", "fio", "git", "kill", "ls", "mkdir", "mpirun", "nproc", "perf", "pip", "pip3",
    "python", "python3", "rm", "source", "srun", "sudo", "time", "timeout", "torchrun", "accelerate",
    "nvidia-smi", "compute-sanitizer", "numactl", "taskset", "tar", "du", "df", "mount", "sleep",
    "watch", "grep", "head", "tail", "sort", "uniq", "wc", "xargs", "find", "touch", "dd", "aws",
    "deepspeed", "gdb", "valgrind", "nsys", "ncu", "make", "ninja", "g++", "clang++", "nvcc", "free",
}
# Wrappers run another program: the first repo program among their arguments is checked.
WRAPPERS = {"mpirun", "srun", "timeout", "env", "time", "sudo", "eval", "bash", "sh", "python",
            "python3", "torchrun", "numactl", "taskset", "nice", "exec", "perf", "compute-sanitizer",
            "gdb", "valgrind", "nsys", "ncu"}
MARKER = re.compile(r"^\s*<!--\s*(file|snippet|commands|ci: test command)\s*(?::\s*(\S+)\s*)?-->\s*$")


class Checker:
    def __init__(self, root, build, max_readme):
        self.root = Path(root).resolve()
        self.build = Path(build).resolve() if build else None
        self.max_readme = max_readme
        self.problems = []
        self._help = {}
        self._referenced = None
        self._presets = None

    def problem(self, page, line, what):
        self.problems.append(f"{page}:{line}: {what}")

    # --- pages -------------------------------------------------------------------------------
    def default_pages(self):
        pages = [p for p in ("README.md", "BENCHMARKS.md") if (self.root / p).exists()]
        docs = self.root / "docs"
        if docs.is_dir():
            pages += sorted(str(p.relative_to(self.root)) for p in docs.rglob("*.md"))
        return pages

    def check_page(self, page):
        path = self.root / page
        if not path.is_file():
            self.problem(page, 0, "no such page")
            return
        lines = path.read_text(encoding="utf-8").split("\n")
        if page == "README.md" and self.max_readme and len(lines) - (lines[-1] == "") > self.max_readme:
            self.problem(page, len(lines), f"README.md has {len(lines) - (lines[-1] == '')} lines; at most {self.max_readme}")
        prose = []  # (line number, text) outside code blocks
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)(```+|~~~+)\s*([^\s`]*)", lines[i])
            if not m:
                prose.append((i + 1, lines[i]))
                i += 1
                continue
            indent, fence, lang = m.group(1), m.group(2), m.group(3)
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", lines[i]):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            if i == len(lines):
                self.problem(page, start, "code block never closed")
            i += 1
            self.check_block(page, start, lang, body, self.marker_above(lines, start - 1))
        self.check_links_and_paths(page, prose)

    def marker_above(self, lines, fence_index):
        j = fence_index - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        return MARKER.match(lines[j]) if j >= 0 else None

    # --- refreshing ---------------------------------------------------------------------------
    def refresh_page(self, page):
        """Rewrites each file/snippet block of `page` from its source; returns how many changed."""
        path = self.root / page
        lines = path.read_text(encoding="utf-8").split("\n")
        out, changed, k = [], 0, 0
        while k < len(lines):
            out.append(lines[k])
            m = MARKER.match(lines[k])
            fence = k + 1 < len(lines) and lines[k + 1].startswith("```") and len(lines[k + 1]) > 3
            if not m or m.group(1) not in ("file", "snippet") or not m.group(2) or not fence:
                k += 1
                continue
            end = next((j for j in range(k + 2, len(lines)) if lines[j].startswith("```")), None)
            rel, _, name = m.group(2).partition("#")
            src = self.root / rel
            text = src.read_text(encoding="utf-8") if src.is_file() else None
            body = (text.rstrip("\n") if m.group(1) == "file" else self.region(text, name)) if text is not None else None
            if end is None or body is None:  # left for the check to report
                k += 1
                continue
            new = body.rstrip("\n").split("\n")
            changed += new != lines[k + 2:end]
            out += [lines[k + 1], *new, lines[end]]
            k = end + 1
        if changed:
            path.write_text("\n".join(out), encoding="utf-8")
        return changed

    # --- code blocks -------------------------------------------------------------------------
    def check_block(self, page, line, lang, body, marker):
        if not lang:
            self.problem(page, line, "code block names no language (```text for output)")
            return
        if lang == "text":
            return
        if not marker:
            self.problem(page, line, f"```{lang} block has no marker above it saying how it is tested "
                                     "(<!-- file: P -->, <!-- snippet: P#NAME -->, <!-- commands -->)")
            return
        kind, arg = marker.group(1), marker.group(2)
        text = "\n".join(body)
        if kind == "file":
            source = self.source_text(page, line, arg)
            if source is not None and text.rstrip("\n") != source.rstrip("\n"):
                self.problem(page, line, f"block differs from {arg}{self.first_difference(text, source)}")
            if source is not None:
                self.check_tested(page, line, arg)
        elif kind == "snippet":
            if not arg or "#" not in arg:
                self.problem(page, line, "snippet marker needs PATH#NAME")
                return
            rel, name = arg.split("#", 1)
            source = self.source_text(page, line, rel)
            if source is None:
                return
            region = self.region(source, name)
            if region is None:
                self.problem(page, line, f"{rel} has no region 'doc-snippet: {name}' ... 'doc-snippet-end'")
                return
            if text.rstrip("\n") != region.rstrip("\n"):
                self.problem(page, line, f"block differs from {rel}#{name}{self.first_difference(text, region)}")
            self.check_tested(page, line, rel)
        else:
            if lang not in ("sh", "bash", "shell", "console"):
                self.problem(page, line, f"a <!-- {kind} --> marker stands above a ```{lang} block, not a shell one")
                return
            self.check_commands(page, line, body)

    @staticmethod
    def first_difference(a, b):
        la, lb = a.rstrip("\n").split("\n"), b.rstrip("\n").split("\n")
        for k, (x, y) in enumerate(zip(la, lb)):
            if x != y:
                return f" (its line {k + 1}: page {x.strip()!r}, source {y.strip()!r})"
        return f" (page has {len(la)} lines, source {len(lb)})"

    def source_text(self, page, line, rel):
        if not rel:
            self.problem(page, line, "marker names no file")
            return None
        path = self.root / rel
        if not path.is_file():
            self.problem(page, line, f"marker names {rel}, which does not exist")
            return None
        return path.read_text(encoding="utf-8")

    @staticmethod
    def region(source, name):
        lines = source.split("\n")
        begin = [k for k, l in enumerate(lines) if re.search(r"doc-snippet:\s*" + re.escape(name) + r"\s*(-->)?\s*$", l)]
        if len(begin) != 1:
            return None
        out = []
        for l in lines[begin[0] + 1:]:
            if "doc-snippet-end" in l:
                break
            out.append(l)
        else:
            return None
        indents = [len(l) - len(l.lstrip()) for l in out if l.strip()]
        cut = min(indents) if indents else 0
        return "\n".join(l[cut:] for l in out)

    def referenced_names(self):
        """Text of every file that makes the build or the test run: CMake files, .ci/run, ctest scripts."""
        if self._referenced is None:
            parts = []
            for p in self.root.rglob("*"):
                rel = p.relative_to(self.root)
                if rel.parts and rel.parts[0] in ("build", ".git", ".venv") or not p.is_file():
                    continue
                if p.name == "CMakeLists.txt" or p.suffix == ".cmake" or str(rel) in (".ci/run", "CMakePresets.json"):
                    parts.append(p.read_text(encoding="utf-8", errors="replace"))
            self._referenced = "\n".join(parts)
        return self._referenced

    def check_tested(self, page, line, rel):
        p = Path(rel)
        if p.parts[0] == "tests" and p.name.startswith("test_") and p.suffix == ".py":
            return  # collected by pytest (tests/python, tests/docs)
        if p.name == "CMakeLists.txt" and p.parts[0] == "tests":
            return  # a consumer project the consumer tests configure
        if re.search(r"(?<![\w.-])" + re.escape(p.name) + r"(?![\w.-])", self.referenced_names()):
            return
        self.problem(page, line, f"{rel} is shown but no CMakeLists.txt, ctest script or .ci/run names it: "
                                 "nothing compiles or runs it")

    # --- shell commands ----------------------------------------------------------------------
    def check_commands(self, page, line, body):
        joined, buf, first = [], "", line + 1
        for k, l in enumerate(body):
            if not buf:
                first = line + 1 + k
            if l.rstrip().endswith("\\"):
                buf += l.rstrip()[:-1] + " "
                continue
            joined.append((first, buf + l))
            buf = ""
        if buf:
            joined.append((first, buf))
        for n, text in joined:
            if not text.strip() or text.strip().startswith("#"):
                continue
            try:
                lex = shlex.shlex(text, posix=True, punctuation_chars=";&|")
                lex.whitespace_split = True
                lex.commenters = "#"
                tokens = list(lex)
            except ValueError as e:
                self.problem(page, n, f"cannot parse the command: {e}")
                continue
            command = []
            for t in tokens + [";"]:
                if t in (";", "&&", "||", "|", "&"):
                    if command:
                        self.check_command(page, n, command)
                    command = []
                else:
                    command.append(t)

    def check_command(self, page, line, words):
        for w in words:  # a command inside $(...) is a command too
            for inner in re.findall(r"\$\(([^()]*)\)", w):
                self.check_commands(page, line - 1, [inner])
        k = 0
        while k < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[k]):
            k += 1
        if k == len(words):
            return
        prog = words[k]
        if prog.startswith("$"):
            return
        name = Path(prog).name
        if name in WRAPPERS or prog in WRAPPERS or prog.endswith("/python") or prog.endswith("/python3"):
            for j in range(k + 1, len(words)):
                if self.is_repo_program(words[j]):
                    self.check_program(page, line, words[j], words[j + 1:])
                    return
            return
        if name in SYSTEM_PROGRAMS or prog.endswith("/pip"):
            if name in ("cmake", "ctest"):
                self.check_presets(page, line, words[k + 1:])
            return
        if prog == "..." or "<" in prog:
            return
        if not self.is_repo_program(prog):
            self.problem(page, line, f"'{prog}' is neither a program of this repository nor a known system program")
            return
        self.check_program(page, line, prog, words[k + 1:])

    def is_repo_program(self, word):
        if word.startswith("build/"):
            return True
        if word in self.built_programs():
            return True
        return "/" in word and (self.root / word).is_file()

    def built_programs(self):
        return {"strata-bench": "bench/strata-bench", "offload_demo": "examples/offload_demo",
                "mpi_train": "examples/mpi_train", "train_mlp": "examples/train_mlp", "core_demo": "examples/core_demo"}

    def check_presets(self, page, line, args):
        if self._presets is None:
            import json
            try:
                data = json.loads((self.root / "CMakePresets.json").read_text())
                self._presets = {p["name"] for key in ("configurePresets", "buildPresets", "testPresets")
                                 for p in data.get(key, [])}
            except (OSError, ValueError):
                self._presets = set()
        for j, a in enumerate(args):
            value = a.split("=", 1)[1] if a.startswith("--preset=") else args[j + 1] if a == "--preset" and j + 1 < len(args) else None
            if value is not None and value not in self._presets:
                self.problem(page, line, f"--preset {value} is not a preset of CMakePresets.json")

    def check_program(self, page, line, prog, args):
        options = [a.split("=", 1)[0] for a in args if a.startswith("--") and len(a) > 2]
        if prog.startswith("build/"):
            parts = Path(prog).parts
            rel = str(Path(*parts[2:])) if len(parts) > 2 else ""
            presets = self.check_presets_names()
            if len(parts) < 3 or (presets and parts[1] not in presets):
                self.problem(page, line, f"{prog}: '{parts[1] if len(parts) > 1 else ''}' is not a build preset's folder")
            known = {v: k for k, v in self.built_programs().items()}
            name = known.get(rel, Path(rel).name)
        elif prog in self.built_programs():
            name, rel = prog, self.built_programs()[prog]
        else:
            path = self.root / prog
            if not path.is_file():
                self.problem(page, line, f"{prog} does not exist")
                return
            if path.suffix not in (".py",) and not os.access(path, os.X_OK):
                self.problem(page, line, f"{prog} is not executable")
            source = path.read_text(encoding="utf-8", errors="replace")
            for o in options:
                if not re.search(re.escape(o) + r"(?![\w-])", source):
                    self.problem(page, line, f"{prog} does not take {o} (not in its source)")
            return
        sub = next((a for a in args if not a.startswith("-")), None) if name == "strata-bench" else None
        text = self.help_text(rel, sub) if self.build else None
        if text is None:
            text = self.program_source(name)
            if text is None:
                self.problem(page, line, f"{prog}: no such program (not built, no source found)")
                return
        if "benchmark/benchmark.h" in text:  # Google Benchmark's own options
            options = [o for o in options if not o.startswith("--benchmark_")]
        for o in options:
            if not re.search(re.escape(o) + r"(?![\w-])", text):
                self.problem(page, line, f"{prog}{' ' + sub if sub else ''} does not take {o}")

    def check_presets_names(self):
        self.check_presets("", 0, [])
        return self._presets

    def help_text(self, rel, sub):
        binary = self.build / rel
        if not binary.is_file():
            return None
        key = (rel, sub)
        if key not in self._help:
            cmd = [str(binary)] + ([sub] if sub else []) + ["--help"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                # A program that cannot even print its help here (an MPI program outside mpirun
                # under a sanitizer) is judged by its source instead.
                self._help[key] = r.stdout + r.stderr if r.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                self._help[key] = None
        return self._help[key]

    def program_source(self, name):
        bench = re.match(r"^strata_(\w+)_bench$", name)  # strata_core_bench: bench/core_bench.cpp
        sources = {"strata-bench": ["bench/strata_bench"]}.get(name, [f"examples/{name}.cpp", f"examples/{name}.cu",
                                                                      f"bench/{name}.cpp"])
        if bench:
            sources.append(f"bench/{bench.group(1)}_bench.cpp")
        text = []
        for s in sources:
            p = self.root / s
            if p.is_dir():
                text += [f.read_text(encoding="utf-8", errors="replace") for f in sorted(p.rglob("*.[ch]pp"))]
            elif p.is_file():
                text.append(p.read_text(encoding="utf-8", errors="replace"))
        return "\n".join(text) if text else None

    # --- links and paths ---------------------------------------------------------------------
    def check_links_and_paths(self, page, prose):
        base = (self.root / page).parent
        for n, text in prose:
            plain = re.sub(r"`[^`]*`", "``", text)
            targets = [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", plain)]
            targets += [m.group(1) for m in re.finditer(r"^\s*\[[^\]]+\]:\s*(\S+)", plain)]
            for t in targets:
                self.check_link(page, n, base, t)
            for code in re.findall(r"`([^`]+)`", text):
                self.check_path(page, n, code.strip())

    def check_link(self, page, line, base, target):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (base / path).resolve() if path else (self.root / page).resolve()
        if path and not dest.exists():
            self.problem(page, line, f"link to {target}: {path} does not exist")
            return
        if anchor:
            if dest.is_dir() or dest.suffix != ".md":
                self.problem(page, line, f"link to {target}: an anchor into something that is not a page")
            elif anchor not in self.anchors(dest):
                self.problem(page, line, f"link to {target}: {dest.name} has no heading #{anchor}")

    def anchors(self, md):
        slugs, seen, fenced = set(), {}, False
        for l in md.read_text(encoding="utf-8").split("\n"):
            if re.match(r"^\s*(```|~~~)", l):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", l)
            if not m:
                continue
            s = re.sub(r"[^\w\- ]", "", re.sub(r"`", "", m.group(1)).strip().lower()).replace(" ", "-")
            if s in seen:
                seen[s] += 1
                s = f"{s}-{seen[s]}"
            else:
                seen[s] = 0
            slugs.add(s)
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', md.read_text(encoding="utf-8")):
            slugs.add(m.group(1))
        return slugs

    def check_path(self, page, line, token):
        if re.search(r"\s|[<>{}*$|:=]|\.\.\.|^-|^~|^/|^\.\./|,", token) or "/" not in token:
            return
        first = token.split("/", 1)[0]
        if first in TOP_FOLDERS:
            candidates = [self.root / token]
        elif first in HEADER_FOLDERS:
            candidates = [self.root / "include" / "strata" / token]
        elif first == "strata" and token.endswith((".hpp", ".cuh", "/")):
            candidates = [self.root / "include" / token, self.root / "python" / token]
        else:
            return
        if not any(c.exists() for c in candidates):
            self.problem(page, line, f"`{token}` names a path that does not exist")

    def check_headers(self):
        include = self.root / "include" / "strata"
        for h in sorted(include.rglob("*")) if include.is_dir() else []:
            if h.suffix not in (".hpp", ".cuh", ".h"):
                continue
            first = next((l for l in h.read_text(encoding="utf-8", errors="replace").split("\n") if l.strip() and l.strip() != "#pragma once"), "")
            if not first.lstrip().startswith("//"):
                self.problem(str(h.relative_to(self.root)), 1, "a public header must open with a comment stating its contract")

    def check_index(self, pages):
        index = self.root / "docs" / "README.md"
        docs = [p for p in pages if p.startswith("docs/") and p != "docs/README.md"]
        if not docs:
            return
        if not index.is_file():
            self.problem("docs/README.md", 0, "there is no page index (docs/README.md)")
            return
        text = index.read_text(encoding="utf-8")
        for p in docs:
            rel = os.path.relpath(self.root / p, index.parent)
            if not re.search(r"\]\(\s*" + re.escape(rel) + r"(#[^)]*)?\)", text):
                self.problem("docs/README.md", 0, f"the page index does not link {p}")


def main():
    ap = argparse.ArgumentParser(description="Check strata's Markdown pages: tested code blocks, links and paths.")
    ap.add_argument("--root", default=".", help="repository root (default: .)")
    ap.add_argument("--build", help="build directory whose programs answer --help (e.g. build/default)")
    ap.add_argument("--pages", nargs="*", help="pages relative to the root (default: README.md, BENCHMARKS.md, docs/**/*.md)")
    ap.add_argument("--max-readme", type=int, default=300, help="most lines README.md may have (0: no limit)")
    ap.add_argument("--refresh", action="store_true",
                    help="first rewrite the pages' file and snippet blocks from their sources, then check")
    args = ap.parse_args()
    c = Checker(args.root, args.build, args.max_readme)
    pages = args.pages or c.default_pages()
    if args.refresh:
        for p in pages:
            n = c.refresh_page(p)
            if n:
                print(f"check-docs: refreshed {n} block(s) of {p}", file=sys.stderr)
    for p in pages:
        c.check_page(p)
    if not args.pages:
        c.check_index(pages)
        c.check_headers()
    for p in c.problems:
        print(p)
    print(f"check-docs: {len(pages)} pages, {len(c.problems)} problems", file=sys.stderr)
    return 1 if c.problems else 0


if __name__ == "__main__":
    sys.exit(main())
