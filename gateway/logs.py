"""structlog set-up: every line the process writes on stderr is one JSON object. Log lines carry ids,
names, counts and timings — never message content, upstream URLs, keys or upstream bodies.

The gateway's own lines come from structlog; the standard-``logging`` ones (the state stores,
uvicorn, asyncio, ``warnings``) reach the root handler, whose ``ProcessorFormatter`` renders them
with the same renderer and a ``logger`` field. Uncaught exceptions are logged as well, not printed.
With tracing on (``gateway/observability/tracing.py``), every line written inside a span carries its
``trace_id`` and ``span_id``.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType

import structlog
from structlog.typing import EventDict, Processor

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# uvicorn.Config applies uvicorn's LOGGING_CONFIG (plain-text handlers on these, not propagating)
# unless it is given log_config=None; configure_logging points that default at the root handler.
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_SILENCED = ("mcp", "httpx2", "httpcore2")

log = structlog.get_logger("gateway")
_trace_ids = False  # set once an app turns tracing on: until then the processor costs a global read


def enable_trace_ids() -> None:
    """Log lines carry the current span's ids from now on (called when tracing is configured)."""
    global _trace_ids
    _trace_ids = True


def add_trace_ids(logger: object, method: str, event: EventDict) -> EventDict:
    """The structlog processor: ``trace_id``/``span_id`` (hex, as OTLP and W3C write them) of the
    current span, when tracing is on and there is one."""
    if _trace_ids:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            event["trace_id"] = format(ctx.trace_id, "032x")
            event["span_id"] = format(ctx.span_id, "016x")
    return event


def configure_logging(level: str = "info", json_logs: bool = True) -> None:
    renderer: Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    stamped: list[Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *stamped,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # one write per line (print's two would let workers sharing stderr interleave mid-line)
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamped],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Libraries' debug output can carry content (websockets logs frames): theirs starts at info.
    root.setLevel(max(_LEVELS[level], logging.INFO))
    # The MCP SDK and its HTTP client log what a server answered (a raw body, a URL): the MCP
    # client (adapters/mcp) logs each failure itself, by kind.
    for name in _SILENCED:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.captureWarnings(True)
    _uvicorn_through_root()
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread
    sys.unraisablehook = _unraisable


def log_config_error(message: str) -> None:
    """A configuration that does not validate, at ``serve``'s start: one JSON line (``config_invalid``)
    on stderr with ``message`` (which names the bad fields), in the default logging set-up."""
    configure_logging()
    log.error("config_invalid", detail=message)


def _uvicorn_through_root() -> None:
    from gateway.server.internals import LOGGING_CONFIG

    LOGGING_CONFIG["handlers"] = {}
    LOGGING_CONFIG["loggers"] = {name: {"handlers": [], "propagate": True} for name in _UVICORN_LOGGERS}
    for name in _UVICORN_LOGGERS:  # a uvicorn.Config made earlier applied the plain-text default
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def _uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    log.critical("uncaught_exception", exc_info=(kind, exc, tb))


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _uncaught(args.exc_type, args.exc_value, args.exc_traceback)


def _unraisable(args: sys.UnraisableHookArgs) -> None:
    """An exception Python could not raise (in ``__del__``, a finalizer...): its ``err_msg`` and
    traceback, not the object involved."""
    exc = (args.exc_type, args.exc_value, args.exc_traceback) if args.exc_value is not None else None
    log.error("unraisable_exception", detail=args.err_msg or "Exception ignored", exc_info=exc)
