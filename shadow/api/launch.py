"""``shadow serve`` and ``shadow proxy``: what a listening command takes from its flags, and how it runs.

The settings come from the environment and ``serve.env``; the flags win over both:

- ``--model``, ``--host``, ``--port``, ``--metrics-public``: the settings of the same names.
- ``--token-file PATH``: the token, read from a file (first line, blanks stripped), so that it never
  stands on a command line where ``ps`` shows it to every user of the machine.
- ``--ssl-keyfile`` / ``--ssl-certfile``: HTTPS, both or neither (uvicorn's TLS).
- ``--access-log all|requests|off``: ``requests`` (the default) leaves probes and scrapes (``/health``,
  ``/ready``, ``/metrics`` and their prefixed forms) out of the access log, which they would otherwise
  fill; ``all`` keeps them; ``off`` writes none.
- ``--stay-up`` (serve): a model that fails to load ends ``shadow serve`` with exit status 1, so that a
  supervisor sees it and restarts it; with ``--stay-up`` it keeps answering, ``/health`` 503 with the
  reason. The proxy always stays up: relaying never depends on the shadow.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("shadow.serve")
ACCESS_LOGS = ("all", "requests", "off")


def add_flags(parser: argparse.ArgumentParser, serve: bool) -> None:
    """The flags ``serve`` and ``proxy`` share (``serve``: also ``--stay-up``)."""
    parser.add_argument("--model", default=None, help="overrides QWEN38_SHADOW_MODEL (the checkpoint folder)")
    parser.add_argument("--port", type=int, default=None, help="overrides QWEN38_SHADOW_PORT")
    parser.add_argument("--host", default=None, help="overrides QWEN38_SHADOW_HOST")
    parser.add_argument("--env-file", default="serve.env", help="the settings file (default: ./serve.env)")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="read the token from this file (overrides QWEN38_SHADOW_TOKEN; never on a command line)")
    parser.add_argument("--ssl-keyfile", default=None, help="TLS private key (with --ssl-certfile: HTTPS)")
    parser.add_argument("--ssl-certfile", default=None, help="TLS certificate chain (with --ssl-keyfile)")
    parser.add_argument("--metrics-public", action="store_true",
                        help="/metrics, /health and /ready without the token, from loopback "
                             "(QWEN38_SHADOW_METRICS_PUBLIC)")
    parser.add_argument("--access-log", default="requests", choices=ACCESS_LOGS,
                        help="requests (default): every request but probes and scrapes; all; off")
    parser.add_argument("--log-level", default="info")
    if serve:
        parser.add_argument("--stay-up", action="store_true",
                            help="keep serving when the model fails to load (/health 503 with the reason) "
                                 "instead of exiting 1")


def setup_logging(level: str) -> None:
    """shadow's own loggers to stderr, one line each (uvicorn configures only its own)."""
    logger = logging.getLogger("shadow")
    if not any(getattr(h, "shadow_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.shadow_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level.upper())


def server_config(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's settings from the flags: the log level, the access log, TLS."""
    config: dict[str, Any] = {"log_level": args.log_level, "access_log": args.access_log != "off"}
    if args.ssl_keyfile or args.ssl_certfile:
        config.update(ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
    return config


def _token_file(path: str) -> str:
    from shadow.core.errors import ShadowError

    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ShadowError(f"--token-file {path}: cannot be read: {err}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise ShadowError(f"--token-file {path}: empty (the token is its first line)")
    return token


def _tls(args: argparse.Namespace) -> None:
    from shadow.core.errors import ShadowError

    given = [(flag, p) for flag, p in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile))
             if p]
    if len(given) == 1:
        raise ShadowError(f"{given[0][0]} given alone: HTTPS needs --ssl-keyfile and --ssl-certfile")
    for flag, p in given:
        if not Path(p).is_file():
            raise ShadowError(f"{flag} {p}: no such file")


def listening(args: argparse.Namespace, command: str) -> tuple[Any, Any] | None:
    """(settings, container) for a command that listens, from the settings and the flags; None
    (having said why) when they are bad or would listen beyond loopback without a token."""
    from shadow.container import build_container
    from shadow.core.errors import ShadowError
    from shadow.core.settings import ShadowSettings

    from .server import is_loopback

    overrides: dict[str, object] = {}
    for flag in ("port", "host", "model"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    if args.metrics_public:
        overrides["metrics_public"] = True
    try:
        _tls(args)
        if args.token_file:
            overrides["token"] = _token_file(args.token_file)
        settings = ShadowSettings(_env_file=args.env_file, **overrides)
        container = build_container(settings)
        container.profiles()  # a bad profile file fails here, at start, naming the file and key
    except ShadowError as err:
        print(f"shadow {command}: {err}", file=sys.stderr)
        return None
    if not settings.token and not is_loopback(settings.host):
        print(f"shadow {command}: refusing to listen on {settings.host} without a token: anyone who reaches it "
              "could feed, overwrite or forget sessions. Set QWEN38_SHADOW_TOKEN or --token-file (clients send "
              "it as Authorization: Bearer ... or X-Shadow-Token), or listen on 127.0.0.1.", file=sys.stderr)
        return None
    return settings, container


def cmd_serve(args: argparse.Namespace) -> int:
    """The service from settings (environment and serve.env) and flags, until interrupted; 1 when the
    model failed to load (unless ``--stay-up``)."""
    from shadow.adapters import allocator, logs

    from .app import create_app
    from .server import keep_worker_threads, serve

    setup_logging(args.log_level)
    # before the model's and the server's threads allocate: their arenas are taken at their first malloc
    print(f"shadow serve: {allocator.tune()}; {keep_worker_threads()}", file=sys.stderr)
    started = listening(args, "serve")
    if started is None:
        return 2
    settings, container = started
    logs.starting("serve", settings, container)
    slot = container.slot()
    failed = (lambda: slot.state == "failed") if not args.stay_up else None
    stopping = logs.Stopping(container)
    serve(create_app(container), settings.host, settings.port, on_exit=stopping.begin,
          stop_when=failed, quiet_paths=args.access_log == "requests", **server_config(args))
    stopping.done()
    if slot.state == "failed" and not args.stay_up:
        log.error("exiting with status 1: the model failed to load (%s); --stay-up keeps serving", slot.error)
        return 1
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    """The OpenAI-compatible proxy in front of ``--upstream``, with the service's own routes."""
    from shadow.adapters import allocator, logs
    from shadow.proxy import create_proxy_app

    from .server import serve

    setup_logging(args.log_level)
    if args.shadow is None:  # the model in this process: its reads allocate on the server's threads, as in serve
        print(f"shadow proxy: {allocator.tune()}", file=sys.stderr)
    started = listening(args, "proxy")
    if started is None:
        return 2
    settings, container = started
    stopping = logs.Stopping(container) if args.shadow is None else None
    if stopping is not None:
        logs.starting("proxy", settings, container)
    app = create_proxy_app(args.upstream, container, timeout_s=args.timeout, engine=args.engine,
                           shadow_url=args.shadow)
    # no Server or Date header of the proxy's own: the client gets the upstream's headers as they were
    serve(app, settings.host, settings.port, on_exit=stopping.begin if stopping is not None else None,
          server_header=False, date_header=False, quiet_paths=args.access_log == "requests", **server_config(args))
    if stopping is not None:
        stopping.done()
    return 0
