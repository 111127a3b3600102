"""Benchmarks for hubproxy's hot path (not timed tests)."""
