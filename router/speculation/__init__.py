"""Speculative-decoding telemetry: normalized records, sliding windows, auto-disable (pure)."""
