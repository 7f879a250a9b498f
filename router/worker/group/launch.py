"""A group's launcher: ``mlx.launch`` with its arguments read from a private directory.

``python -m router.worker.group.launch <directory>``. mlx.launch takes the ring backend's
first port on its command line (``--starting-port``), and starts each local rank as
``bash -c <script>`` whose text holds the ring's hostfile (every rank's address and port):
both are readable by every local user (``ps``, ``/proc/<pid>/cmdline``), who could then take
a port or connect to it while the group starts, and fail the start. Here the arguments come
from ``GROUP_LAUNCH_FILE`` in a directory only this user may read (0700; the router makes
it, fills it and removes it when the launcher exits, ``router.lanes.rankgroup``), and each
local rank's script is written there too (0600) and sourced (``bash -c ". <file>"``): the
command lines show the directory's name and nothing else. A rank on another host is started
over ssh as mlx.launch does it (its script on ssh's command line: mlx.launch has no other
way to hand it over).

mlx.launch is run in this process (``mlx._distributed_utils.launch.main``, what its console
script runs); its one private name this relies on is listed in ``router.worker.mlx_private``.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.kernel.grouplaunch import write_private
from router.kernel.worker_contract import GROUP_LAUNCH_FILE

# mlx.launch's RemoteProcess.make_launch_script(rank, python, cwd, files, env, command,
# is_local): the text of the shell script that starts one rank.
Script = Callable[[int, Any, Any, Any, Any, Any, bool], str]


def private_scripts(make_script: Script, directory: Path) -> Script:
    """``make_script`` with each local rank's script in a 0600 file of ``directory``, run by
    sourcing it: the same shell does the same (its pid is the one mlx.launch records, and
    the script's last ``exec`` turns it into the rank), and its text is on no command line."""

    def make_launch_script(
        rank: int, python: Any, cwd: Any, files: Any, env: Any, command: Any, is_local: bool
    ) -> str:
        script = make_script(rank, python, cwd, files, env, command, is_local)
        if not is_local:
            return script
        path = directory / f"rank-{rank}.sh"
        write_private(path, script + "\n")
        return f". {shlex.quote(str(path))}"

    return make_launch_script


def read_arguments(directory: Path) -> list[str]:
    """mlx.launch's arguments, as the router wrote them (a JSON array of strings)."""
    path = directory / GROUP_LAUNCH_FILE
    args = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{path}: not a JSON array of strings")
    return args


def main(argv: list[str] | None = None) -> int:
    (where,) = sys.argv[1:] if argv is None else argv
    directory = Path(where)
    args = read_arguments(directory)
    from mlx._distributed_utils import launch

    process = launch.RemoteProcess
    process.make_launch_script = staticmethod(  # type: ignore[method-assign]
        private_scripts(process.make_launch_script, directory)
    )
    sys.argv = ["mlx.launch", *args]
    result = launch.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
