"""The web dashboard: pages and static assets served by the API server (no CDN)."""
