"""The API application factory.

``create_app()`` builds the FastAPI app: health endpoints now, the ``/v1`` routers as the
control plane grows. Routes stay thin: parse, authorise, call one service, map errors.
"""

from __future__ import annotations

from fastapi import FastAPI

from gpupool import __version__


def create_app() -> FastAPI:
    """Build the API application."""
    app = FastAPI(
        title="gpupool",
        version=__version__,
        description="GPU pooling: fractional slices, fair scheduling, accounting.",
    )

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> dict[str, str]:
        """Readiness: the server can take requests."""
        return {"status": "ready"}

    @app.get("/v1/version", tags=["meta"])
    def version() -> dict[str, str]:
        """The server's gpupool version."""
        return {"version": __version__}

    return app
