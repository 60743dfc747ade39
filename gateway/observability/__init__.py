"""Observability: the Prometheus metrics and the OpenTelemetry tracing behind the engine's
``Observer`` and ``Tracer`` interfaces (``gateway/engine/telemetry.py``)."""
