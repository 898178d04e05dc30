"""What the studies run as `python -m aotconv.bench.<study>` share: their argument parser, the
command line their results record, writing those results (the JSON and the table beside it),
and a bad input said in one line (exit status 2), as the aotconv command does.
"""
import argparse
import json
from pathlib import Path
import shlex
import sys

from ..errors import AotconvError


def parser(module, doc):
    """The argument parser of `python -m <module>`, the module's docstring `doc` its help."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def command(module, argv):
    """The command line that runs `module` with `argv` (None: this process's own arguments),
    quoted for a shell."""
    args = argv if argv is not None else sys.argv[1:]
    return f"python -m {module} " + " ".join(shlex.quote(x) for x in args)


def write_results(path, doc, table=None, table_path=None):
    """`doc` as JSON at `path` (its folder made where missing) and, with `table`, that markdown
    at `table_path` (default: `path` with .md)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    if table is not None:
        (Path(table_path) if table_path else path.with_suffix(".md")).write_text(table)


def entry(prog, main):
    """`main(argv)` as a script's entry point: an AotconvError is one line `<prog>: error: ...`
    on stderr and exit status 2, without a traceback."""
    def run(argv=None):
        try:
            return main(argv)
        except AotconvError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
    return run
