"""Wire models (pydantic, ``extra="forbid"``) shared by the API, the client and the agent."""
