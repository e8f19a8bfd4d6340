"""`python -m generator [--check]`: regenerate (or check) the sources made from specs/."""
from __future__ import annotations

import argparse
import os
import sys

from .build import generate
from .errors import SpecError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m generator", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a generated file is stale, missing or left over")
    parser.add_argument("--root", default=REPO_ROOT, help="repository root to write into (default: this checkout)")
    parser.add_argument("--specs", default=None, help="folder of specs (default: ROOT/specs)")
    parser.add_argument("--namespace", default="avo", help="torch.library namespace of the ops (default: avo)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing when all is well")
    args = parser.parse_args(argv)
    specs_dir = args.specs or os.path.join(args.root, "specs")
    try:
        outcome = generate(args.root, specs_dir, check=args.check, namespace=args.namespace)
    except SpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        problems = [f"stale: {p}" for p in outcome.written] + [f"left over: {p}" for p in outcome.removed]
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("generated sources are out of date; run `python -m generator`", file=sys.stderr)
            return 1
        if not args.quiet:
            print("generated sources are up to date")
        return 0
    if not args.quiet:
        for path in outcome.written:
            print(f"wrote {path}")
        for path in outcome.removed:
            print(f"removed {path}")
        if not outcome.written and not outcome.removed:
            print("generated sources are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
