"""Typed HTTP SDK used by the CLI, the agent and users' code."""
