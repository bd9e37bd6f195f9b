"""Layer 4: the HTTP server, OpenAI, Anthropic Messages and OpenAI Responses on one engine.

`main.py` starts it and `app.py` routes. One module per wire format: `openai_api.py`,
`anthropic_*.py`, `responses_*.py`. What they share: `params.py` (a request's fields),
`prompt.py` (chat templates), `generation.py` and `row_request.py` (a request's rows on the
engine), `text.py` (output text, reasoning, tool calls), `streaming.py` (SSE, work off the
event loop), `errors.py`, `schemas.py` (OpenAPI). The models: `provider.py` and `budget.py`
(memory, prompt store); `metrics.py` is `/metrics`.
"""
