"""Regenerate the example output in docs/*.md from the commands that print it.

Run it from the repository root, in the pinned environment:

    source scripts/env.sh && python scripts/gen_doc_examples.py            # rewrite every page's examples
    source scripts/env.sh && python scripts/gen_doc_examples.py --check    # exit 1 naming each stale page
    source scripts/env.sh && python scripts/gen_doc_examples.py docs/trace.md   # only these pages

A page marks an example with two comments around a fenced block:

    <!-- example: ./ddpbench predict --trace $OUT/t.json ... | grep -E '^  bucket' -->
    ```text
    (the command's output, written by this script)
    ```
    <!-- /example -->

The comment's text is a bash command (it may span lines; `-->` ends it). It runs from the repository
root under `bash -e -o pipefail`, with `$OUT` an empty temporary folder for whatever it writes, and
its stdout replaces the block; in that output the temporary folder reads `/tmp`, so `$OUT/t.json`
shows as `/tmp/t.json`, as the pages' own commands name their files. A command whose output holds
timings keeps only its stable lines, with a filter in the command itself (`grep`, `sed`): an example
must print the same on any machine, or `--check` calls it stale. A command that fails (exit status
not 0) stops the script with status 2, naming page, example and command, and its stderr.

Each example should take seconds (under about 30 s on 2 cores): the test suite runs `--check`.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# The opening comment (its command), the block (anything, up to the closing comment), the closing comment.
EXAMPLE = re.compile(r"<!-- example:(?P<command>.*?)-->\n(?P<block>.*?)<!-- /example -->", re.DOTALL)


@dataclass(frozen=True)
class Example:
    """One marked example of a page: its command and the block the page holds now."""

    command: str
    block: str
    start: int  # offsets of the block in the page's text
    end: int


def find_examples(text: str) -> list[Example]:
    """The page's marked examples, in page order."""
    return [Example(m["command"].strip(), m["block"], m.start("block"), m.end("block"))
            for m in EXAMPLE.finditer(text)]


def fenced(output: str) -> str:
    """A command's output as the block the page holds: a ```text fence, trailing spaces removed."""
    lines = [line.rstrip() for line in output.strip("\n").splitlines()]
    return "```text\n" + "\n".join(lines) + "\n```\n"


def render(text: str, run: Callable[[str], str]) -> str:
    """The page with each example's block replaced by `run(command)`, fenced."""
    pieces, last = [], 0
    for example in find_examples(text):
        pieces += [text[last:example.start], fenced(run(example.command))]
        last = example.end
    return "".join(pieces) + text[last:]


class ExampleFailed(Exception):
    """A marked command exited with a status other than 0."""


def run_command(command: str) -> str:
    """Run one marked command from the repository root, with $OUT a fresh temporary folder; its stdout."""
    with tempfile.TemporaryDirectory(prefix="ddpbench-doc-example-") as out:
        env = dict(os.environ, OUT=out, COLUMNS="100")
        # `python` and `./ddpbench` in the command are the environment this script runs in.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ExampleFailed(f"exit status {done.returncode}\n{done.stderr.strip()}")
        return done.stdout.replace(out, "/tmp")


def pages(paths: list[str]) -> list[Path]:
    """The pages named, or every page under docs/ that marks an example."""
    if paths:
        return [Path(p).resolve() for p in paths]
    return [p for p in sorted(DOCS.glob("*.md")) if find_examples(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, compare) the marked examples of the pages."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", help="pages to regenerate (default: every docs/*.md with an example)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page whose examples differ from their commands")
    args = parser.parse_args(argv)
    stale = []
    for page in pages(args.pages):
        name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        text = page.read_text()
        commands = []

        def run(command: str) -> str:
            commands.append(command)
            return run_command(command)

        try:
            new = render(text, run)
        except ExampleFailed as error:
            print(f"gen_doc_examples: {name}, example {len(commands)} failed: {commands[-1]}\n{error}",
                  file=sys.stderr)
            return 2
        count = len(commands)
        if new == text:
            print(f"up to date: {name} ({count} example(s))")
        elif args.check:
            stale.append(str(name))
            print(f"stale: {name}: its examples differ from what their commands print now "
                  f"(regenerate: python scripts/gen_doc_examples.py {name})")
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       f"{name} (page)", f"{name} (commands)"))
        else:
            page.write_text(new)
            print(f"wrote {name} ({count} example(s))")
    if stale:
        print(f"stale page(s): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
