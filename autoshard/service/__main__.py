"""``python -m autoshard.service``: ``autoshard serve`` alone, so the server imports no torch.

Why a second entry point: ``autoshard``'s command line builds every
subcommand's parser, and some subcommands' modules import torch (hundreds
of MiB of resident memory on a box that only serves plans). The flags and
the behaviour are those of ``autoshard serve`` (:mod:`autoshard.cli.serve`).

    python -m autoshard.service --port 8470 --cache /var/cache/autoshard --token-file /etc/autoshard/token
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from autoshard.cli.serve import add_arguments, run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags of ``autoshard serve`` and run it; user errors are one line, exit code 2."""
    parser = argparse.ArgumentParser(prog="python -m autoshard.service",
                                     description="run the plan service: HTTP API, job queue, result cache")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError) as exc:
        print(f"autoshard serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
