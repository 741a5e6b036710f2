"""The broker's half of the `minibroker` command: `serve` runs the broker, `config-table`
prints the settings table, `--version` says which broker this is.

`build_parser` takes the registrars of more verbs rather than importing them:
`minibroker_cli` adds the client's, so the installed command has every verb while
nothing in `broker` imports `client`. `python -m broker` has the broker's verbs only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import resource
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

import anyio

from broker import __version__, logs
from broker import config as cfg
from broker.partitions import ProducerIdStateError
from broker.security import BootstrapError
from broker.storage import DataDirError

log = logging.getLogger(f"minibroker.{__name__}")

# The exit codes of `serve` (docs/operations.md, "Exit codes"). Each start that cannot
# succeed has its own, distinct from a crash (1), so that systemd's
# RestartPreventExitStatus stops retrying it (deploy/minibroker.service lists them).
EXIT_CONFIG_ERROR = 2  # also argparse's, for a bad command line
EXIT_REFUSED_TO_START = 3  # the data dir: locked, unwritable, foreign, unrecoverable
EXIT_ADDRESS_IN_USE = 4  # another process listens on the port or the metrics port
# What ends a start that cannot succeed as it is: a data dir that is locked, damaged or
# foreign, producer-id state that cannot be trusted, bootstrap users that cannot be made.
REFUSALS = (DataDirError, ProducerIdStateError, BootstrapError)

# CLI flags that map one-to-one onto settings of the same name.
SERVE_FLAGS = (
    "host",
    "port",
    "data_dir",
    "backend",
    "log_level",
    "log_format",
    "metrics_host",
    "metrics_port",
    "pid_file",
)

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
"""Adds subcommands to the `minibroker` parser, as `client.cli.register` does."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a mistyped flag is reported by the (sub)command it was given
    to, with that command's usage, and a mistyped flag or choice names the closest one
    (what Python 3.14's suggest_on_error does for choices; 3.11 has neither).

    Subcommands' parsers are of this class too: `add_subparsers` makes its parsers of
    the class of the parser it is called on, so every verb the client registers has it."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's parser is called through parse_known_args and hands what it does
        # not know to the top level, which would report it with the top-level usage.
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            message = f"unrecognized arguments: {' '.join(extras)}"
            # Names compared without their dashes, which every flag shares.
            flags = [s[2:] for s in self._option_string_actions if s.startswith("--")]
            for extra in extras:
                if extra.startswith("--"):
                    match = cfg.closest(extra[2:].split("=", 1)[0], flags)
                    if match:
                        message += f" (did you mean --{match}?)"
                        break
            self.error(message)
        return parsed, extras

    def _check_value(self, action: argparse.Action, value: object) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            match = cfg.closest(str(value), [str(choice) for choice in choices])
            if match:
                listed = ", ".join(map(repr, choices))
                raise argparse.ArgumentError(
                    action,
                    f"invalid choice: {value!r}, maybe you meant {match!r}? (choose from {listed})",
                )
        super()._check_value(action, value)


def build_parser(more: Sequence[Registrar] = ()) -> argparse.ArgumentParser:
    """The `minibroker` parser: the broker's verbs, then those each of `more` adds."""
    # Typed as argparse's own so that registrars take plain subparsers; they are Parsers.
    parser: argparse.ArgumentParser = Parser(
        prog="minibroker",
        description="A single-process broker with Kafka's idempotent producer guarantees.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the broker in the foreground")
    serve.add_argument(
        "--config", metavar="FILE.toml", help="settings file (see docs/configuration.md)"
    )
    for name in SERVE_FLAGS:
        s = cfg.SETTINGS[name]
        # No argparse types or choices: flags are checked by the settings table like the
        # TOML file, so a bad value gets the same one-line message naming the range.
        serve.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"{s.doc} Allowed: {s.allowed()}{' ' + s.unit if s.unit else ''} "
            f"(default {s.default!r})",
        )
    serve.set_defaults(func=run_serve)
    sub.add_parser("config-table", help="print the settings table (markdown)").set_defaults(
        func=lambda _args: print(cfg.markdown_table()) or 0
    )
    for register in more:
        register(sub)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k) for k in SERVE_FLAGS if getattr(args, k) is not None}
    try:
        config = cfg.load(args.config, overrides)
    except cfg.ConfigError as exc:
        print(f"minibroker: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    logs.setup(config.log_level, config.log_format)
    # A write past RLIMIT_FSIZE must fail with EFBIG (answered as a storage
    # error) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # Every partition holds its segment files open: take all the descriptors allowed.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    with _without_hypothesis():
        from broker.app import Broker
        from broker.network import ListenError

    try:
        # Loads the TLS certificate and key: a file that does not load is a setting
        # that cannot be used.
        broker = Broker(config, lambda: cfg.load(args.config, overrides))
    except cfg.ConfigError as exc:
        print(f"minibroker: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    backend_options = {"use_uvloop": True} if config.backend == "asyncio" else {}
    refusals = (*REFUSALS, ListenError, cfg.ConfigError)
    reasons: list[BaseException]
    try:
        anyio.run(broker.run, backend=config.backend, backend_options=backend_options)
    except refusals as exc:
        reasons = [exc]
    except BaseExceptionGroup as group:
        # Raised inside the broker's task group (recovery): the same refusals, wrapped.
        refused, others = group.split(refusals)
        if refused is None or others is not None:
            raise
        reasons = _leaves(refused)
    except KeyboardInterrupt:
        return 130
    else:
        return 0
    for reason in reasons:
        log.error("event=refused_to_start reason=%r", str(reason))
    ports = [reason for reason in reasons if isinstance(reason, ListenError)]
    if ports:
        return EXIT_ADDRESS_IN_USE if ports[0].in_use else EXIT_CONFIG_ERROR
    if any(isinstance(reason, cfg.ConfigError) for reason in reasons):
        return EXIT_CONFIG_ERROR
    return EXIT_REFUSED_TO_START


@contextlib.contextmanager
def _without_hypothesis() -> Iterator[None]:
    """Hide hypothesis from the imports inside: kio registers a hypothesis strategy for
    each of its types when hypothesis is importable, which pulls in hypothesis and pytest,
    half of a broker's start (0.25 s) where a test suite has them installed. Only a fresh
    process hides it: one that already has hypothesis (or kio) is left as it is."""
    hide = "hypothesis" not in sys.modules and "kio" not in sys.modules
    if hide:
        sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import fails
    try:
        yield
    finally:
        if hide:
            del sys.modules["hypothesis"]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for exc in group.exceptions
        for leaf in (_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    ]


def main(argv: Sequence[str] | None = None, more: Sequence[Registrar] = ()) -> int:
    parser = build_parser(more)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
