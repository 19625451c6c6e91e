"""Logging: structlog and the standard library through one handler, one renderer.

Every line, whether logged through a structlog logger from `make_logger` or through a plain
`logging.getLogger(...)` of a library (redis, kopf and its aiohttp), is rendered by the same
`ProcessorFormatter`: JSON lines in production (stream not a TTY), colourful console otherwise.

What the election's outcomes say is decided in elector/telemetry/outcome_log.py, for the daemon
and the library alike; this module sets up where and how the lines are written.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Literal, TextIO, get_args

import structlog
import structlog.tracebacks
from structlog.typing import EventDict, Processor, WrappedLogger

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


@dataclasses.dataclass(frozen=True, slots=True)
class LogSettings:
    format: LogFormat = "auto"
    #: A level name, case-insensitive: debug, info, warning, error, critical.
    level: str = "info"

    def __post_init__(self) -> None:
        if self.format not in LOG_FORMATS:
            raise ValueError(f"unknown log format {self.format!r}; expected one of {', '.join(LOG_FORMATS)}")
        if self.level.lower() not in LOG_LEVELS:
            raise ValueError(f"unknown log level {self.level!r}; expected one of {', '.join(LOG_LEVELS)}")

    @property
    def level_number(self) -> int:
        return LOG_LEVELS[self.level.lower()]


class _ElectorHandler(logging.StreamHandler[TextIO]):
    """Marks the handler `configure_logging` installs, so a second call can replace it."""


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _formatter(*, json: bool) -> structlog.stdlib.ProcessorFormatter:
    renderer: list[Processor]
    # Tracebacks never show local variables: frames hold the Redis settings (password) and lease
    # values (the secret owner token).
    if json:
        renderer = [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(),
        ]
    else:
        renderer = [structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)]
    return structlog.stdlib.ProcessorFormatter(
        # Only for standard-library records: keep their `extra=` fields as keys.
        foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
        # Run for every record, structlog's and foreign, so both carry the same keys.
        processors=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *renderer,
        ],
    )


class _DemoteClientProtocolErrors(logging.Filter):
    """A malformed request (a scanner, an oversized header) is the client's fault, already answered
    with 400: keep it at DEBUG, without a traceback, so nobody can flood the logs with ERRORs.

    For aiohttp servers in the same process (kopf's, under `elector operator`); elector's own
    HTTP server (h11) logs these at DEBUG itself (`http_bad_request`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "aiohttp.server" or not record.exc_info or record.exc_info[1] is None:
            return True
        error = record.exc_info[1]
        if not any(cls.__name__ == "BadHttpMessage" for cls in type(error).__mro__):
            return True
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = f"{record.getMessage()}: {error}", ()
        record.exc_info, record.exc_text = None, None
        return True


def configure_logging(settings: LogSettings, *, stream: TextIO | None = None) -> None:
    """Route all logging to `stream` (stderr by default) through one structlog renderer.

    Replaces the handler installed by an earlier call; leaves other handlers alone.
    """
    out = sys.stderr if stream is None else stream
    use_json = settings.format == "json" or (settings.format == "auto" and not _is_tty(out))
    handler = _ElectorHandler(out)
    handler.setFormatter(_formatter(json=use_json))
    handler.addFilter(_DemoteClientProtocolErrors())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ElectorHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level_number)
    # kopf's aiohttp (operator) logs access lines: noise at INFO. (A logger by name: no import.)
    logging.getLogger("aiohttp.access").setLevel(max(logging.WARNING, settings.level_number))


def _capture_exc_info(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    # Resolve `exc_info=True` while the exception is current, not whenever a handler formats it.
    if event_dict.get("exc_info") is True:
        event_dict["exc_info"] = sys.exc_info()
    return event_dict


def _context_adder(context: Callable[[], Mapping[str, object]]) -> Processor:
    def add_context(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        try:
            extra = context()
        except Exception as exc:  # logging must never fail because the status could not be read
            event_dict.setdefault("context_error", repr(exc))
            return event_dict
        # Keys given at the call site are more specific than the ambient context.
        for key, value in extra.items():
            event_dict.setdefault(key, value)
        return event_dict

    return add_context


def make_logger(name: str, *, context: Callable[[], Mapping[str, object]]) -> structlog.stdlib.BoundLogger:
    """A structlog logger over `logging.getLogger(name)` that adds `context()` to every line.

    `context` is called at log time (only for lines that pass the level filter), so values
    such as the election state are current without rebinding.
    """
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            _context_adder(context),
            _capture_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return logger
