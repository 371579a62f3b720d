"""HTTP API: ``create_app()``, thin routers under ``/v1``, problem+json errors."""
