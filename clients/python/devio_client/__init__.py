"""devio_client - a standard-library Python client of devio-server (api/openapi.yaml)."""
from .client import Client, ConnectionLost, DevioError, Response, TicketPending
from .masks import allowed_tokens, mask_from_words
from .prefix import hex_of, prefix_hashes, sum64
from . import types

__all__ = ["Client", "ConnectionLost", "DevioError", "Response", "allowed_tokens",
           "mask_from_words", "TicketPending", "hex_of", "prefix_hashes", "sum64", "types"]
