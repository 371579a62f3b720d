"""Thin routers: parse, authorise (through the services), call one service, shape the answer."""
