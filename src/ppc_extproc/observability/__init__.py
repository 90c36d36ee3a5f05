"""Observability: Prometheus metrics and structlog configuration."""
