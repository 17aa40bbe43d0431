"""Telemetry tests share the root conftest's `sync_calls` fixture."""
