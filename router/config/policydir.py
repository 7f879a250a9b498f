"""Where the policies are when no one says (pure apart from checking which directories exist).

- ``--policies DIR`` and ``SPECLANE_POLICIES_DIR``: as given (relative to the current
  directory, like any path typed on a command line).
- ``policies_dir`` in a configuration file: relative to that file's directory, so that a
  service started from anywhere (systemd, launchd) finds the policies next to its config.
- Not set anywhere: ``./policies`` when it exists (a checkout), else ``policies/`` next to
  the configuration file, else the default policies shipped inside the package
  (``router/policies``: package data; in a checkout a link to the repository's
  ``policies/``).
"""

from __future__ import annotations

from pathlib import Path

PACKAGED_POLICIES = Path(__file__).resolve().parent.parent / "policies"


def relative_to_config(value: str, config: Path) -> str:
    """A ``policies_dir`` from a configuration file, resolved against the file's directory."""
    given = Path(value).expanduser()
    return str(given if given.is_absolute() else config.resolve().parent / given)


def default_policies_dir(config: Path | None, cwd: Path | None = None) -> Path:
    here = (cwd or Path.cwd()) / "policies"
    candidates = [here]
    if config is not None:
        candidates.append(config.resolve().parent / "policies")
    candidates.append(PACKAGED_POLICIES)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate if candidate is not here else Path("policies")
    return Path("policies")  # none: the app warns that every client gets the default


def is_packaged(directory: Path) -> bool:
    return directory.absolute() == PACKAGED_POLICIES
