"""An engine process: `python -m mlxd.serve.process.child`, started by the server (remote.py).

It reads its settings from stdin (a pickle), loads the model and its engine, says Ready, then
serves Submit / Cancel / Arrive / Call messages. Token events leave through one outbox drained
by a sender thread, one message per drain. It exits when its stdin closes: the server is gone."""

import os
import pickle
import queue
import struct
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from ...config import apply_to_process
from ...engine.arrivals import Arrivals
from ...engine.request import DoneEvent, RequestHandle, TokenEvent
from ..budget import hold_to_budget
from ..loading import build_engine, draft_facts, kv_config_of, load_draft, load_model
from ..log_format import configure
from . import wire


class Forwarding(RequestHandle):
    """A row's handle whose events go to the server instead of a local reader."""

    def __init__(self, rid: int, out: "queue.SimpleQueue[Any]", rows: dict[int, Any]) -> None:
        super().__init__()
        self.rid, self.out, self.rows = rid, out, rows

    def admit(self, cached_tokens: int) -> None:
        super().admit(cached_tokens)
        self.out.put(wire.Admit(self.rid, cached_tokens))

    def put(self, event: Any) -> None:
        self.put_quiet(event)

    def put_quiet(self, event: Any) -> list:
        if isinstance(event, TokenEvent):
            top = event.top_logprobs
            self.out.put(wire.Tok(self.rid, event.token, event.text, event.finish,
                                  event.logprob, top, event.from_draft))  # fmt: skip
            return []
        self.out.put(done_message(self.rid, event))
        self.rows.pop(self.rid, None)
        self.run_on_done()
        return []


def done_message(rid: int, e: DoneEvent) -> wire.Done:
    kind = type(e.error).__name__ if e.error is not None else None
    return wire.Done(rid, e.reason, kind, str(e.error or ""), e.prompt_tokens, e.completion_tokens,
                     e.cached_tokens, e.text, dict(e.timings), e.drafted_tokens,
                     e.accepted_tokens)  # fmt: skip


class Child:
    def __init__(self, init: dict[str, Any]) -> None:
        self.config = c = init["config"]
        configure(c.log_level, c.log_format)  # its lines read as the server's
        apply_to_process(c)
        hold_to_budget(c)
        self.kv_config = kv_config_of(c)
        self.arrivals = Arrivals(c.join_window)  # the server's, mirrored by Arrive messages
        model, tokenizer = load_model(c, init["folder"], init["adapter"])
        self.model, self.tokenizer = model, tokenizer
        self.engine, self.facts = build_engine(c, model, tokenizer, init["folder"], init["adapter"],
                                               init["held"], self.arrivals)  # fmt: skip
        if init["draft"] is not None:
            draft = load_draft(c, self.engine, model, tokenizer, init["draft"])
            draft_facts(self.facts, draft, model)
        self.rows: dict[int, Forwarding] = {}
        self.out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.calls = ThreadPoolExecutor(4, thread_name_prefix="mlxd-call")

    def send_loop(self, sock: Any) -> None:
        """One message per drain of the outbox: a step's events for every row go together."""
        while True:
            items = [self.out.get()]
            while True:
                try:
                    items.append(self.out.get_nowait())
                except queue.Empty:
                    break
            if any(item is None for item in items):
                sock.send(wire.encode([i for i in items if i is not None]))
                return
            sock.send(wire.encode(items))

    def serve(self, sock: Any) -> None:
        while True:
            msg = wire.to_child(sock.recv())
            if isinstance(msg, wire.Cancel):
                if (row := self.rows.get(msg.rid)) is not None:
                    row.cancel()
            elif isinstance(msg, wire.Arrive):
                self.arrive(msg.kind)
            elif isinstance(msg, wire.Submit):
                self.reply(msg.call, lambda m=msg: self.submit(m))
            elif msg.method == "close":
                self.reply(msg.call, self.close)
                return
            else:
                self.calls.submit(self.reply, msg.call, getattr(self, "call_" + msg.method),
                                  *msg.args)  # fmt: skip

    def reply(self, call: int, fn: Any, *args: Any) -> None:
        try:
            self.out.put(wire.Reply(call, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - raised again on the server's side
            self.out.put(wire.Reply(call, None, type(e).__name__, str(e)))

    def submit(self, msg: wire.Submit) -> None:
        reqs = [self.request(spec, rid) for spec, rid in zip(msg.specs, msg.rids, strict=False)]
        handles = [Forwarding(rid, self.out, self.rows) for rid in msg.rids]
        for h in handles:
            self.rows[h.rid] = h
        try:
            if msg.n > 1:
                self.engine.submit_n(reqs[0], msg.n, handles=handles)
            elif len(reqs) > 1:
                self.engine.submit_many(reqs, handles=handles)
            else:
                self.engine.submit(reqs[0], handle=handles[0])
        except BaseException:
            for h in handles:
                self.rows.pop(h.rid, None)
            raise

    def request(self, spec: wire.RowSpec, rid: int) -> Any:
        req = wire.request_of(spec)
        req.kv_config = self.kv_config
        if spec.constraint is not None:  # the grammar masks last, as row_request.py orders it
            from ...constrain import compiler_for
            from ...constrain.processor import GrammarLogitsProcessor

            grammar = GrammarLogitsProcessor(compiler_for(self.tokenizer).matcher(spec.constraint))
            req.logits_processors = [*req.sampling.processors(), grammar]
        if spec.progress:
            req.prompt_progress_callback = lambda done, total: self.out.put(
                wire.Progress(rid, done, total)
            )
        return req

    def arrive(self, kind: str) -> None:
        if kind == "came":
            self.arrivals.came()
        elif kind == "released":
            self.arrivals.released()
        else:
            self.arrivals.replied()

    # Calls (each on a worker thread: a long one does not hold up cancels)
    def call_stats(self) -> dict[str, Any]:
        sharing = self.engine.sharing
        store = sharing.store.stats() if sharing is not None else None
        return {"engine": self.engine.stats(), "store": store}

    def call_rows(self) -> list[dict[str, Any]]:
        return self.engine.rows_snapshot()

    def call_drain_s(self) -> float | None:
        return self.engine.admission.drain_s()

    def call_load_adapter(self, name: str, path: str) -> None:
        self.engine.load_adapter(name, path)

    def call_unload_adapter(self, name: str) -> None:
        self.engine.unload_adapter(name)

    def call_adapters(self) -> dict[str, int]:
        return {n: self.engine.adapter_bytes(n) for n in self.engine.adapter_names()}

    def call_set_kv_budget(self, budget: int | None) -> None:
        self.engine.set_kv_budget(budget)

    def call_embed(self, ids: list[list[int]], pooling: str, dimensions: int | None) -> Any:
        from ...engine.embed import embed

        return embed(self.model, ids, pooling, dimensions, self.engine.driver.lock)

    def close(self) -> None:
        self.engine.close()
        if (sharing := self.engine.sharing) is not None and not sharing.store.closed:
            sharing.store.close()


def _read_init() -> dict[str, Any]:
    stdin = sys.stdin.buffer
    (size,) = struct.unpack("<Q", stdin.read(8))
    return pickle.loads(stdin.read(size))


def _exit_when_orphaned() -> None:
    """The server holds our stdin open: EOF means it is gone, and so is every reader."""
    while sys.stdin.buffer.read(1 << 16):
        pass
    os._exit(0)


def main() -> None:
    init = _read_init()
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(init["to_parent"])
    try:
        child = Child(init)
    except BaseException as e:  # noqa: BLE001 - the server raises it as the load's error
        push.send(wire.encode([wire.Failed(type(e).__name__, str(e))]))
        traceback.print_exc()
        push.close()
        ctx.term()
        sys.exit(1)
    pull = ctx.socket(zmq.PULL)
    pull.connect(init["to_child"])
    facts = wire.facts_dict(child.facts)
    has_store = child.engine.sharing is not None
    child.out.put(wire.Ready(facts, child.engine.batch, os.getpid(), has_store))
    sender = threading.Thread(target=child.send_loop, args=(push,), daemon=True)
    sender.start()
    child.serve(pull)
    child.out.put(None)  # after close's reply: sent, then the sender ends
    sender.join(timeout=10)
    pull.close()
    push.close()
    ctx.term()  # waits (LINGER) until the last messages are out of zmq's queue
    os._exit(0)


if __name__ == "__main__":
    main()
