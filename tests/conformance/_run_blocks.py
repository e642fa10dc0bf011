"""Run one page's code blocks in order, in one namespace, as a reader runs the page.

``python -m tests.conformance._run_blocks BLOCKS.json``, started by test_docs_snippets in
the page's own empty folder. Each block is compiled under the page's path at its own line
(a traceback points into the page and shows its lines), run in one ``__main__`` module
that the page's blocks share, and followed by the line :data:`END` on stdout, so the test
can tell what each block printed and which one failed. Connections to anything but this
machine are refused.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from tests.support.network import guard

#: Printed after each block that ran to its end (no block prints it).
END = "\x1e-- end of block --\x1e"


def main(blocks_file: str) -> None:
    guard()
    blocks = json.loads(Path(blocks_file).read_text())
    module = types.ModuleType("__main__")  # what a script runs in, as runpy makes it
    sys.modules["__main__"] = module
    for block in blocks:
        source = "\n" * (block["line"] - 1) + block["code"]
        code = compile(source, block["path"], "exec", dont_inherit=True)  # no __future__
        exec(code, module.__dict__)
        print(END, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
