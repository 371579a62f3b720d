"""Prometheus metric definitions, in one place, and their collectors."""
