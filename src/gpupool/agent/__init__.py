"""The node agent: registers devices, runs jobs inside their slices, reports telemetry."""
