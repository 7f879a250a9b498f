"""``speclane models``: its flags (the preparation itself: tests/lanes/test_modelprep.py)."""

from __future__ import annotations

import pytest

from router.cli import models


def test_cli_needs_a_subcommand() -> None:
    with pytest.raises(SystemExit) as info:
        models.main([])
    assert info.value.code == 2
