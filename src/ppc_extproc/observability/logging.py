"""structlog configuration. Only the CLI calls ``configure_logging``; importing configures nothing."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """JSON lines (default) or a console renderer, filtered at ``level``, on stderr."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that use stdlib logging (grpc, aiohttp) go to stderr at the same level.
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
