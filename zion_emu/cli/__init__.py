"""The ``zion-emu`` command line (the commands are listed in ``zion_emu.__main__``).

Each command is a module with ``add_parser(subparsers)`` and ``run(args) -> int``.
A user's mistake raises :class:`CliError` (or the model's ``ConfigError`` /
``ValueError``); ``zion_emu.__main__`` prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from zion_emu.platform import Platform, load_platform, preset_names


class CliError(Exception):
    """A bad command line, stated in the user's words."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, and takes
    options only by their whole names: an abbreviation would claim a
    script's own argument (``run train.py --n 2`` read as --nproc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


def add_platform_arguments(parser: argparse.ArgumentParser, one_value_per_set: bool = False) -> None:
    """--platform and --set. Commands that end with a script and its arguments
    take one PATH=VALUE per --set, so the script is not read as another."""
    parser.add_argument("--platform", metavar="NAME|FILE", default=None,
                        help=f"preset name ({', '.join(preset_names())}) or a .json file; "
                             "default $ZION_PLATFORM or zion")
    if one_value_per_set:
        parser.add_argument("--set", metavar="PATH=VALUE", dest="assignments", action="append", default=[],
                            help="override a preset field, e.g. --set fabric.topology=ring (repeatable)")
    else:
        parser.add_argument("--set", metavar="PATH=VALUE", dest="assignments", action="extend", nargs="+",
                            default=[], help="override a preset field, e.g. --set fabric.topology=ring")


def platform_from(args: argparse.Namespace) -> Platform:
    return load_platform(args.platform, assignments=args.assignments)


def gb(bytes_per_s: float) -> float:
    """bytes/s -> GB/s with GB = 1e9, as the presets and nccl-tests count."""
    return bytes_per_s / 1e9


def num(x: float) -> str:
    """A short human number: 20.8, 25, 1300, 34.29."""
    return f"{x:.4g}"
