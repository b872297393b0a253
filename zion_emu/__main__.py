"""``python -m zion_emu`` / ``zion-emu``: the commands listed in ``COMMANDS``."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

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


class _StdoutUntilClosed:
    """stdout that goes quiet once its reader has gone (``zion-emu run ... |
    head``): later prints are dropped instead of raising, so a command still
    writes its files (--report, --json, ...) and exits with its own code."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        # The real descriptor too: the interpreter flushes it again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        self._stream = open(os.devnull, "w")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Runs one command; a user's mistake is one line on stderr and exit code 2."""
    stdout = sys.stdout
    sys.stdout = _StdoutUntilClosed(stdout)
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
    except MemoryError:
        print("zion-emu: error: out of host memory; model fewer ranks, nodes or smaller sizes", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _null_for_closed_streams() -> None:
    """A process started with stdout or stderr closed (``>&-``, ``2>&-``)
    gets /dev/null there: what it and the processes it starts (torchrun's
    agent, the ranks) print goes nowhere, and the run still writes its files
    and exits with its own code."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)  # the lowest free descriptor: fd itself when those below are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w", closefd=False))


def program() -> int:
    """``main`` as the process's own program (``python -m zion_emu``, the
    ``zion-emu`` script). What exists now (torch's and zion's modules) lives
    as long as the process: out of the cyclic collector's passes, its exit
    takes about a second less on 2 cores. Not in ``main``, which a caller's
    process may run: there it would keep that process's garbage for good."""
    _null_for_closed_streams()
    gc.freeze()
    return main()


if __name__ == "__main__":
    sys.exit(program())
