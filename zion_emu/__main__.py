"""``python -m zion_emu`` / ``zion-emu``: the commands listed in ``COMMANDS``."""

from __future__ import annotations

import os
import sys

from zion_emu.cli import CliError, Parser, bench_collectives, collectives, info, run, sweep, tour
from zion_emu.platform import ConfigError

# Each module has add_parser(subparsers); the help lists them in this order.
COMMANDS = (
    info,
    collectives,
    bench_collectives,
    tour,
    run,
    sweep,
)


def _parser() -> Parser:
    parser = Parser(prog="zion-emu", description="A virtual Facebook Zion training platform: "
                                                 "inspect the modeled machine and time collectives on it.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; a user's mistake is one line on stderr and exit code 2."""
    try:
        args = _parser().parse_args(argv)
        return args.func(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:  # e.g. `zion-emu collectives | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, ConfigError, ValueError, OSError) as e:
        print(f"zion-emu: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
