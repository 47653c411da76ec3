"""Qualification on a live GPU, one module per step: plan (groups of symbols per device) -> supervise (isolated
worker subprocesses speaking events.py; the worker runs checks.py over spec.py's launches) -> sanitize ->
compare (across GPUs) -> assemble (the qualified manifest) -> keys (sign and write); runner orchestrates."""
