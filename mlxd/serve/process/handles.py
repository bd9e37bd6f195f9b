"""The server's side of a row in an engine process: a RequestHandle fed from the socket, and
the errors that come back by name, raised again as the types the server already handles."""

from collections.abc import Callable
from typing import Any

from ...engine.admission import KVBudgetExceeded, Overloaded
from ...engine.embed import TooManyDimensions
from ...engine.request import DoneEvent, RequestHandle, TokenEvent, Watchers
from ...model import ModelLoadError
from ...model.lora.adapter import AdapterError
from ..errors import APIError
from . import wire

_ERRORS: dict[str, type[BaseException]] = {
    cls.__name__: cls
    for cls in (
        Overloaded,
        KVBudgetExceeded,
        TooManyDimensions,
        AdapterError,
        ModelLoadError,
        ValueError,
        KeyError,
        RuntimeError,
        OSError,
        TimeoutError,
    )  # fmt: skip
}


def error_of(kind: str | None, message: str) -> BaseException:
    """The exception an engine process reported, as its type where the server knows it."""
    cls = _ERRORS.get(kind or "", RuntimeError)
    if cls is KeyError:
        return KeyError(message.strip("'\""))
    return cls(message)


class RemoteHandle(RequestHandle):
    """Cancel crosses to the engine process; events arrive through `deliver`."""

    def __init__(self, rid: int, send_cancel: Callable[[int], None]) -> None:
        super().__init__()
        self.rid = rid
        self._send_cancel = send_cancel
        self.progress: Callable[[int, int], None] | None = None  # the request log's callback

    def cancel(self) -> None:
        if not self.cancelled and self.done is None:
            super().cancel()
            self._send_cancel(self.rid)

    def deliver(self, item: Any) -> Watchers:
        """One item of a message from the engine process (on the server's receiver thread)."""
        if isinstance(item, wire.Tok):
            top = [(int(t), float(p)) for t, p in item.top] if item.top is not None else None
            event = TokenEvent(item.token, None, item.text, item.finish, item.logprob, top,  # type: ignore[arg-type]
                               item.from_draft)  # fmt: skip
            return self.put_quiet(event)
        if isinstance(item, wire.Done):
            error = error_of(item.kind, item.message) if item.reason == "error" else None
            done = DoneEvent(item.reason, error, None, item.prompt_tokens, item.completion_tokens,
                             item.cached_tokens, item.text, None, item.timings, item.drafted,
                             item.accepted)  # fmt: skip
            return self.put_quiet(done)
        if isinstance(item, wire.Admit):
            self.admit(item.cached)
        elif isinstance(item, wire.Progress) and self.progress is not None:
            self.progress(item.done, item.total)
        return []

    def end(self, error: APIError) -> Watchers:
        """The engine process died: the row ends now with `error`."""
        return self.put_quiet(DoneEvent("error", error))
