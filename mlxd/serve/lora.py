"""Many LoRA adapters over the served model, as vLLM serves them: `--lora-modules NAME=PATH`
registers and loads each at start-up, `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` at runtime, and a request whose `model` is a registered adapter's
name runs its row with that adapter on the served model's engine (engine/adapters.py), in the
same batches as rows with other adapters or none.

At most --max-loras adapters are resident in the engine. A request for a registered adapter
that is not resident loads it again, and any load past the cap first evicts the least recently
used resident adapter no row is using; while every resident one is in use it is a 503 with
Retry-After. Under --memory-budget the resident adapters count as weights: the KV budget
shrinks by their bytes, and a load that leaves it no room is a 400. A runtime load reads the
server's disk: a path --lora-modules did not name needs --allow-model-paths."""

import collections
import logging
import threading
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from ..config import lora_module
from ..model import ModelLoadError
from .budget import kv_budget_from
from .errors import APIError, bad_request, read_json
from .streaming import offload

log = logging.getLogger("mlxd.serve")
RETRY_S = 1  # a row using an adapter ends within a generation; clients retry soon


def _one_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class Loras:
    """The served model's registered adapters (name -> path), least recently used first."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider  # its `default` (the served model), names and config
        self.config = provider.config
        self.paths: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.start_paths: set[str] = set()  # --lora-modules' paths: reloadable at runtime
        self._lock = threading.Lock()  # the registry's order
        self._loading = threading.Lock()  # one load, unload or eviction at a time

    @property
    def engine(self) -> Any:
        return self.provider.default.engine

    def start(self, entries: list[str]) -> None:
        """--lora-modules: a bad entry stops start-up with one line naming it."""
        for entry in entries:
            name, path = lora_module(entry)
            try:
                self.load(name, path)
            except APIError as e:
                raise ModelLoadError(f"--lora-modules {name}={path}: {e.message}") from None
            self.start_paths.add(path)

    def entries(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.paths.items())

    def route(self, name: str | None) -> Any:
        """The served model as a row with adapter `name` runs on it (made resident first), or
        None when no adapter has that name."""
        with self._lock:
            if name is None or name not in self.paths:
                return None
            self.paths.move_to_end(name)  # used last: evicted last
            path = self.paths[name]
        if name not in self.engine.adapter_names():
            with self._loading:
                if name not in self.engine.adapter_names():
                    self._make_room()
                    self._engine_load(name, path)
        return replace(self.provider.default, adapter=name)

    def load(self, name: str, path: str, replace_loaded: bool = False) -> None:
        """Register and load `path` as `name`; APIError 400 for a bad name, path or file."""
        self._check_name(name)
        if self.config.adapter_path is not None:  # its layers are mlx-lm's LoRA layers already
            raise bad_request("per-request adapters do not run over --adapter-path: serve the "
                              "base model and name every adapter in --lora-modules")  # fmt: skip
        with self._loading:
            if name in self.paths:
                if not replace_loaded:
                    raise bad_request(
                        f"The lora adapter '{name}' has already been loaded.", "lora_name"
                    )
                self._unload(name)
            self._make_room()
            self._engine_load(name, path)
            with self._lock:
                self.paths[name] = path

    def unload(self, name: str) -> None:
        """404 when no adapter has that name; 409 while a row uses it."""
        with self._loading:
            if name not in self.paths:
                raise APIError(404, f"The lora adapter '{name}' cannot be found.",
                               param="lora_name", code="model_not_found")  # fmt: skip
            self._unload(name)

    def _unload(self, name: str) -> None:
        try:
            self.engine.unload_adapter(name)
        except KeyError:
            pass  # evicted: registered only
        except ValueError as e:
            raise APIError(409, f"{_one_line(e)}; retry once its rows end", param="lora_name",
                           headers={"Retry-After": str(RETRY_S)}) from e  # fmt: skip
        with self._lock:
            del self.paths[name]
        self._fit()

    def _check_name(self, name: str) -> None:
        if self.provider.serves(name):
            raise bad_request(f"lora_name {name!r} names the served model", "lora_name")

    def _make_room(self) -> None:
        """Evict the least recently used resident adapter no row uses, if the cap is reached."""
        resident = set(self.engine.adapter_names())
        if len(resident) < self.config.max_loras:
            return
        for old in [n for n, _ in self.entries() if n in resident]:
            try:
                self.engine.unload_adapter(old)
            except ValueError:
                continue  # in use
            log.info("adapter %s evicted (--max-loras %d)", old, self.config.max_loras)
            self._fit()
            return
        raise APIError(503, f"all {len(resident)} resident adapters (--max-loras) are in use",
                       headers={"Retry-After": str(RETRY_S)})  # fmt: skip

    def _engine_load(self, name: str, path: str) -> None:
        try:
            self.engine.load_adapter(name, path)
        except (ModelLoadError, ValueError, OSError) as e:
            raise bad_request(_one_line(e), "lora_path") from e
        try:
            self._fit()
        except ModelLoadError as e:
            self.engine.unload_adapter(name)
            raise bad_request(f"adapter {name!r} does not fit: {e}", "lora_path") from e

    def _fit(self) -> None:
        """--memory-budget: the KV budget is what the weights and resident adapters leave."""
        if self.config.memory_budget is None:
            return
        engine, served = self.engine, self.provider.default
        held = sum(engine.adapter_bytes(n) for n in engine.adapter_names())
        budget = kv_budget_from(self.config, served.weight_bytes, held)
        engine.set_kv_budget(budget)


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > 4096:
        raise bad_request(f"{key} must be a non-empty string", key)
    return value


async def load_lora_adapter(request: Request) -> PlainTextResponse:
    """vLLM's body `{"lora_name", "lora_path"[, "load_inplace"]}` and its plain-text answer."""
    loras: Loras = request.app.state.mlxd.provider.loras
    body = await read_json(request)
    name, path = _text(body, "lora_name"), _text(body, "lora_path")
    inplace = body.get("load_inplace", False)
    if not isinstance(inplace, bool):
        raise bad_request("load_inplace must be of type bool", "load_inplace")
    if not (loras.config.allow_model_paths or path in loras.start_paths):
        raise APIError(403, "loading an adapter from a path --lora-modules did not name needs "
                       "--allow-model-paths", param="lora_path")  # fmt: skip
    await offload(lambda: loras.load(name, path, replace_loaded=inplace))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    loras: Loras = request.app.state.mlxd.provider.loras
    body = await read_json(request)
    name = _text(body, "lora_name")
    await offload(lambda: loras.unload(name))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def model_entries(state: Any, created: int) -> list[dict[str, Any]]:
    """/v1/models' entries for the adapters: vLLM's `parent` (the base's id) and `root`."""
    base = state.provider.default
    return [
        {"id": name, "object": "model", "created": created, "owned_by": "mlxd", "root": path,
         "parent": base.name, "max_model_len": base.context_length}
        for name, path in state.provider.loras.entries()
    ]  # fmt: skip


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
