"""Paths a user gives, as morphogen reads them: `~` and `~user` at their start expanded, as a shell would.

A shell expands `~` only in a word of its own: `--output=~/x.pt`, `"~/runs"`, a config file's `run_dir = "~/runs/a"`
and `morphogen.load_grown_model("~/runs/a")` reach morphogen with the `~` still there, and a directory named `~`
would be made in the working directory. So `user_path` is applied where a path enters: to the command's path
arguments as they are parsed (`cli.py`), to the path settings of the configs (`SessionOptions`, `RunConfig.policy`,
`EvalConfig`) whatever builds them (a flag, a config file, Python), and to the paths the public functions take
(`read_config_source`, `export_model`, `load_grown_model`, `grow_over_seeds`). Nothing else changes: links are
not resolved (the run directory's rules about links still see the path given), relative paths stay relative.
"""

from __future__ import annotations

import os


def user_path(path: str | os.PathLike[str]) -> str:
    """`path` with a leading `~` or `~user` expanded to that home directory; any other path as given."""
    return os.path.expanduser(os.fspath(path))


def expand_path_settings(config: object, names: tuple[str, ...]) -> None:
    """Apply `user_path` to the path settings `names` of the frozen config dataclass `config` that hold a string; for
    its `__post_init__`, so that a config file's or Python's `run_dir = "~/runs/a"` is read as a flag's is."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, str):
            object.__setattr__(config, name, user_path(value))  # frozen: set once, while it is being built
