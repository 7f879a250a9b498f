"""A spawnable fake of a group's launcher (``router.worker.group.launch``) without MLX.

    python tests/fakes/fake_launcher.py <directory>

It reads its arguments as the real one does (``GROUP_LAUNCH_FILE`` in the directory):
``--starting-port P --record FILE [--ring-fails N] [--other-fails] -- <worker argv>``.
Each start appends one JSON line to FILE (the port it got, its own command line, the
directory). The first N starts fail as a ring whose port was taken does: the fake takes the
port itself (a stranger's socket), binds it again as a rank would, and exits with mlx's
message ("[ring] Couldn't bind socket (error: 98)"); ``--other-fails``: every start fails
with another error. Otherwise it becomes the worker (exec).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import psutil

from router.kernel.worker_contract import GROUP_LAUNCH_FILE


def main() -> None:
    directory = Path(sys.argv[1])
    args = json.loads((directory / GROUP_LAUNCH_FILE).read_text())
    split = args.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--starting-port", type=int, required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--ring-fails", type=int, default=0)
    p.add_argument("--other-fails", action="store_true")
    opts = p.parse_args(args[:split])
    record = Path(opts.record)
    before = len(record.read_text().splitlines()) if record.exists() else 0
    with open(record, "a") as f:
        # what every local user reads (ps, /proc/<pid>/cmdline)
        line = {
            "port": opts.starting_port,
            "cmdline": psutil.Process().cmdline(),
            "directory": str(directory),
        }
        f.write(json.dumps(line) + "\n")
    if opts.other_fails:
        print("[rank 0] cannot load the model: fake failure", file=sys.stderr, flush=True)
        sys.exit(1)
    if before < opts.ring_fails:
        stranger = socket.socket()
        stranger.bind(("127.0.0.1", opts.starting_port))
        rank = socket.socket()
        try:
            rank.bind(("127.0.0.1", opts.starting_port))
        except OSError as e:
            print(f"RuntimeError: [ring] Couldn't bind socket (error: {e.errno})", file=sys.stderr)
            sys.exit(1)
        sys.exit("the port was not taken")
    worker = args[split + 1 :]
    os.execv(worker[0], worker)


if __name__ == "__main__":
    main()
