"""tools/check-docs.py finds each kind of untrue page, and passes a true one (unittest: stdlib only).

Each case builds a small repository in a temporary directory, breaks one rule and expects the
checker's line naming it.
"""

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[2] / "tools" / "check-docs.py"
FENCE = "`" * 3

PAGES = {
    "CMakePresets.json": '{"version": 3, "configurePresets": [{"name": "default"}], "buildPresets": [{"name": "default"}]}\n',
    "examples/CMakeLists.txt": "add_executable(hello hello.cpp)\n",
    "examples/hello.cpp": "int main() { return 0; }\n",
    "examples/orphan.cpp": "int main() { return 1; }\n",
    "tests/CMakeLists.txt": "strata_add_test(snips SOURCES snips_test.cpp)\n",
    "tests/snips_test.cpp": textwrap.dedent("""\
        void f() {
          // doc-snippet: add
          int x = 1;
          x += 2;
          // doc-snippet-end
        }
        """),
    "include/strata/core/thing.hpp": "#pragma once\n// thing: what it promises.\n",
    "tools/run.sh": "#!/bin/sh\n# usage: run.sh [--alpha N] [--beta]\n",
    "README.md": textwrap.dedent(f"""\
        # demo

        See [the guide](docs/guide.md#adding-numbers) and `examples/hello.cpp`.

        <!-- commands -->
        {FENCE}sh
        tools/run.sh --alpha 3 && cmake --preset default
        {FENCE}
        """),
    "docs/README.md": "# Pages\n\n- [guide](guide.md)\n",
    "docs/guide.md": textwrap.dedent(f"""\
        # Guide

        ## Adding numbers

        <!-- file: examples/hello.cpp -->
        {FENCE}cpp
        int main() {{ return 0; }}
        {FENCE}

        <!-- snippet: tests/snips_test.cpp#add -->
        {FENCE}cpp
        int x = 1;
        x += 2;
        {FENCE}

        {FENCE}text
        output needs no marker
        {FENCE}

        Back to [the top](../README.md#demo).
        """),
}


class CheckDocsTest(unittest.TestCase):
    def make(self, changes=None):
        root = Path(tempfile.mkdtemp(prefix="check-docs-"))
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", str(root)]))
        files = dict(PAGES)
        files.update(changes or {})
        for rel, text in files.items():
            if text is None:
                continue
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        os.chmod(root / "tools/run.sh", stat.S_IRWXU)
        return root

    def run_checker(self, root, *extra):
        r = subprocess.run([sys.executable, str(CHECKER), "--root", str(root), *extra], capture_output=True, text=True)
        return r.returncode, r.stdout

    def expect(self, changes, *needles):
        rc, out = self.run_checker(self.make(changes))
        self.assertEqual(rc, 1, out)
        for n in needles:
            self.assertIn(n, out)

    def guide_with(self, old, new):
        text = PAGES["docs/guide.md"]
        self.assertIn(old, text)
        return {"docs/guide.md": text.replace(old, new)}

    def test_a_true_repository_passes(self):
        rc, out = self.run_checker(self.make())
        self.assertEqual(rc, 0, out)

    def test_a_block_that_is_no_longer_its_file_is_reported(self):
        self.expect({"examples/hello.cpp": "int main() { return 2; }\n"}, "docs/guide.md:6: block differs from examples/hello.cpp")

    def test_a_snippet_that_drifted_from_its_region_is_reported(self):
        self.expect(self.guide_with("x += 2;", "x += 3;"), "block differs from tests/snips_test.cpp#add")

    def test_refresh_rewrites_drifted_blocks_from_their_sources_and_the_check_then_passes(self):
        root = self.make({"tests/snips_test.cpp": PAGES["tests/snips_test.cpp"].replace("x += 2;", "x += 5;"),
                          "examples/hello.cpp": "int main() { return 3; }\n"})
        rc, out = self.run_checker(root)
        self.assertEqual(rc, 1, out)
        rc, out = self.run_checker(root, "--refresh")
        self.assertEqual(rc, 0, out)
        guide = (root / "docs/guide.md").read_text()
        self.assertIn("x += 5;", guide)
        self.assertIn("int main() { return 3; }", guide)
        self.assertIn("output needs no marker", guide)  # other blocks as they were

    def test_a_missing_region_is_reported(self):
        self.expect(self.guide_with("#add", "#sub"), "has no region 'doc-snippet: sub'")

    def test_a_code_block_without_a_marker_is_reported(self):
        self.expect(self.guide_with("<!-- file: examples/hello.cpp -->\n", ""), "block has no marker above it")

    def test_a_fence_without_a_language_is_reported(self):
        self.expect(self.guide_with(FENCE + "text", FENCE), "names no language")

    def test_a_file_nothing_compiles_is_reported(self):
        self.expect({"examples/orphan.cpp": "int main() { return 0; }\n",
                     "docs/guide.md": PAGES["docs/guide.md"].replace("examples/hello.cpp", "examples/orphan.cpp")},
                    "examples/orphan.cpp is shown but no CMakeLists.txt")

    def test_an_option_the_program_does_not_take_is_reported(self):
        self.expect({"README.md": PAGES["README.md"].replace("--alpha 3", "--gamma 3")}, "tools/run.sh does not take --gamma")

    def test_an_unknown_preset_is_reported(self):
        self.expect({"README.md": PAGES["README.md"].replace("--preset default", "--preset fast")},
                    "--preset fast is not a preset")

    def test_an_unknown_program_is_reported(self):
        self.expect({"README.md": PAGES["README.md"].replace("tools/run.sh", "tools/walk.sh")},
                    "'tools/walk.sh' is neither a program of this repository")

    def test_a_broken_link_and_a_broken_anchor_are_reported(self):
        self.expect({"README.md": PAGES["README.md"].replace("docs/guide.md#adding-numbers", "docs/guides.md")},
                    "link to docs/guides.md: docs/guides.md does not exist")
        self.expect({"README.md": PAGES["README.md"].replace("#adding-numbers", "#subtracting")},
                    "guide.md has no heading #subtracting")

    def test_a_path_in_backticks_that_does_not_exist_is_reported(self):
        self.expect({"README.md": PAGES["README.md"].replace("`examples/hello.cpp`", "`examples/hallo.cpp`")},
                    "`examples/hallo.cpp` names a path that does not exist")

    def test_a_page_missing_from_the_index_is_reported(self):
        self.expect({"docs/other.md": "# Other\n"}, "the page index does not link docs/other.md")

    def test_a_public_header_without_its_contract_comment_is_reported(self):
        self.expect({"include/strata/core/thing.hpp": "#pragma once\nint thing();\n"},
                    "include/strata/core/thing.hpp:1: a public header must open with a comment")

    def test_a_readme_over_its_line_limit_is_reported(self):
        rc, out = self.run_checker(self.make(), "--max-readme", "3")
        self.assertEqual(rc, 1)
        self.assertIn("at most 3", out)


if __name__ == "__main__":
    unittest.main()
