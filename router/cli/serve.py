"""``speclane serve``: its flags, the settings they override, and the process around
``router.server.run`` (logging, the collector's thresholds, the event loop)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from pathlib import Path

from router.config.settings import ConfigError, Settings, load_settings
from router.lanes.layout import LAYOUTS
from router.observability.logfmt import LOG_FORMATS, setup_logging
from router.server import GC_THRESHOLDS, StartupError, event_loop_factory, run


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speclane serve", description="Run the speclane router.")
    p.add_argument("--config", type=Path, help="TOML configuration file (default: none)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        metavar="NAME",
        help="a host name requests may carry in their Host header besides "
        "loopback names and the bind address (repeatable; '.example.com' for a "
        "domain and its subdomains, '*' for any; default: allowed_hosts of the "
        "configuration)",
    )
    p.add_argument("--no-lanes", action="store_true", help="do not start the two MLX lanes")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        help="the lanes' worker processes: shared (one process, one copy of the "
        "model, for both lanes), separate (one each) or auto (default: [lanes] "
        "layout of the configuration, auto)",
    )
    p.add_argument(
        "--policies",
        type=Path,
        help="policy directory (default: policies_dir of --config, relative to "
        "it; else ./policies, else policies/ next to --config, else the shipped "
        "defaults)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="log level (default: log_level of the configuration, info); the "
        "access log is written at info, its 5xx lines at warning",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text for people (default) or json: one object per line, with the "
        "access log's fields as keys, for log shippers",
    )
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.allowed_hosts:
        overrides["allowed_hosts"] = tuple(args.allowed_hosts)
    if args.policies:
        overrides["policies_dir"] = args.policies
    lanes: dict[str, object] = {}
    if args.no_lanes:
        lanes["enabled"] = False
    if args.layout:
        lanes["layout"] = args.layout
    if lanes:
        overrides["lanes"] = lanes
    if args.log_level:
        overrides["log_level"] = args.log_level
    return load_settings(args.config, **overrides)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ConfigError as e:
        print(f"speclane: invalid configuration\n{e}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, args.log_format)
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(run(settings))
    except StartupError as e:
        print(f"speclane: could not start: {e}", file=sys.stderr)
        return 1
    return 0
