"""Placement policies, one module each, registered by name."""
