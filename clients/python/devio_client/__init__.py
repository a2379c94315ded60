"""devio_client - a standard-library Python client of devio-server (api/openapi.yaml)."""
from .client import Client, ConnectionLost, DevioError, Response
from . import types

__all__ = ["Client", "ConnectionLost", "DevioError", "Response", "types"]
