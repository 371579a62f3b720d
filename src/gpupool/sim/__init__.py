"""Discrete-event simulator and experiments that drive the real scheduler in-process."""
