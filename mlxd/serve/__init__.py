"""Layer 4: the HTTP surface (OpenAI, Anthropic, Responses). Lands with the server issue."""
