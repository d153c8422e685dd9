"""The REST API (FastAPI) of the live server."""
