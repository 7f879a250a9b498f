"""``speclane worker``: one MLX lane worker, the program ``serve`` spawns as
``python -m router.worker`` (its flags: ``router.kernel.worker_contract``)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from router.worker.main import main as worker  # MLX: imported only when run

    return worker(argv)
