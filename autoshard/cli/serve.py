"""``autoshard serve``: run the plan service (FastAPI on uvicorn) until Ctrl-C.

Why checks before starting: a service started with a bad port, an unreadable
token file or a cache it cannot write would fail later, on its first request
or never visibly; here each is one line and exit code 2 before anything
listens. The socket is bound here (``--port 0`` picks a free port) and the
address printed on stderr as ``autoshard serve: listening on http://HOST:PORT``
once its workers run, so scripts and tests can read it.

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["--port", "0"]).port
'0'
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path

__all__ = ["add_arguments", "run", "DEFAULT_CACHE"]

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "autoshard", "service")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard serve`` (numbers are checked by :func:`run`, one line each)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--port", default="8470", help="TCP port; 0 picks a free one (default %(default)s)")
    parser.add_argument("--cache", default=DEFAULT_CACHE, metavar="DIR", help="result cache (default %(default)s)")
    parser.add_argument("--cache-size", default="1GiB", metavar="SIZE",
                        help="cache bound, least recently used results go first (default %(default)s)")
    parser.add_argument("--workers", default="2", metavar="N",
                        help="worker processes, solves at once (default %(default)s)")
    parser.add_argument("--max-queue", default="64", metavar="N",
                        help="jobs waiting for a worker; one more is answered 429 (default %(default)s)")
    parser.add_argument("--token-file", metavar="F", help="require 'Authorization: Bearer <the file's text>'")
    parser.add_argument("--max-body", default="512MiB", metavar="SIZE",
                        help="request body limit, after gzip inflation; 413 beyond (default %(default)s)")
    parser.add_argument("--max-nodes", default="1000000", metavar="N",
                        help="problem nodes limit; 413 beyond (default %(default)s)")
    parser.add_argument("--max-edges", default="4000000", metavar="N",
                        help="problem edges limit; 413 beyond (default %(default)s)")
    parser.add_argument("--max-time-limit", default="600", metavar="S",
                        help="largest time limit a request may ask, seconds (default %(default)s)")
    parser.add_argument("--time-limit", default="60", metavar="S",
                        help="time limit of problem requests that give none, seconds (default %(default)s)")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="server log level (default %(default)s)")


def _int(text: str, flag: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag}: expected an integer, got {text!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{flag}: must be between {low} and {high}, got {value}")
    return value


def _seconds(text: str, flag: str) -> float:
    from autoshard.cli.values import check_seconds

    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: expected seconds, got {text!r}") from None
    return check_seconds(value, flag)


def _size(text: str, flag: str) -> int:
    from autoshard.cli.values import parse_bytes

    try:
        return parse_bytes(text, flag)
    except ValueError as exc:
        if "expected a size" in str(exc):
            raise ValueError(f"{flag}: expected a size such as 1GiB, 500MB or 1e9, got {text!r}") from None
        raise


def _token(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ValueError(f"--token-file {path}: cannot read ({reason})") from None
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"--token-file {path}: expected one token (non-empty, no spaces)")
    return text


def _writable(path: str) -> str:
    """The cache folder, created if missing; a folder other than the default
    is created only inside an existing one (a typo must not create a tree)."""
    parent = os.path.dirname(os.path.abspath(path))
    if path != DEFAULT_CACHE and not os.path.isdir(parent):
        raise ValueError(f"--cache {path}: not a writable folder (folder {parent} does not exist)")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test."):
            pass
    except OSError as exc:
        raise ValueError(f"--cache {path}: not a writable folder ({exc.strerror or exc})") from None
    return os.path.abspath(path)


def run(args: argparse.Namespace) -> int:
    """Check the flags, bind the socket, serve until interrupted."""
    from autoshard.cli.values import plural
    from autoshard.service.payload import Limits

    port = _int(args.port, "--port", 0, 65535)
    workers = _int(args.workers, "--workers", 1, 256)
    max_queue = _int(args.max_queue, "--max-queue", 1, 1_000_000)
    try:
        limits = Limits(max_body_bytes=_size(args.max_body, "--max-body"),
                        max_nodes=_int(args.max_nodes, "--max-nodes", 1, 10**9),
                        max_edges=_int(args.max_edges, "--max-edges", 1, 10**9),
                        max_time_limit_s=_seconds(args.max_time_limit, "--max-time-limit"),
                        default_time_limit_s=_seconds(args.time_limit, "--time-limit"))
    except ValueError as exc:
        if str(exc).startswith("limits:"):
            raise ValueError("--time-limit: must not exceed --max-time-limit") from None
        raise
    token = _token(args.token_file) if args.token_file else None
    cache_bytes = _size(args.cache_size, "--cache-size")
    try:  # after the flags: a typo is reported even where the service cannot run
        import uvicorn

        from autoshard.service.app import ServiceConfig, create_app
    except ImportError as exc:
        raise ValueError(f"needs FastAPI, uvicorn and prometheus-client ({exc.name} is missing): "
                         "pip install 'autoshard[serve]'") from None
    cache_dir = _writable(args.cache)
    config = ServiceConfig(cache_dir=cache_dir, cache_bytes=cache_bytes, workers=workers,
                           max_queue=max_queue, limits=limits, token=token)
    try:
        info = socket.getaddrinfo(args.host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as exc:
        raise ValueError(f"--host/--port: cannot listen on {args.host}:{port} ({exc.strerror or exc})") from None
    host, bound = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}"

    def ready() -> None:  # the workers run: requests are answered from now on
        print(f"autoshard serve: listening on {url} ({plural(workers, 'worker')}, cache {cache_dir}"
              f"{', token required' if token else ''})", file=sys.stderr, flush=True)

    app = create_app(config, on_ready=ready)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="on"))
    server.run(sockets=[sock])
    return 0
