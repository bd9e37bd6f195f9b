"""Every setting mlxd reads, as typed fields of one config per process.

`EngineConfig` is the engine's (the Python API's `Engine` and each served model's). The few
environment variables mlxd honours are read here and nowhere else (`from_env`). This module
imports nothing of mlxd: every layer may import it.
"""

import argparse
import copy
import json
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# Nothing here imports mlx: mlxd/__init__.py reads MLXD_BLAS from this module and loads the BLAS
# before mlx is first imported (mlxd/blas.py).
DEFAULT_QUANTIZED_KV_START = 5000  # mlx_lm.generate's (tests/test_blas_preload.py checks it)


def _parse_size(text: str) -> int:
    """mlx-lm's size parser ("32GB"), imported when a flag is parsed, after the BLAS loads."""
    from mlx_lm.utils import _parse_size as parse

    return parse(text)


STEP_ORDERS = ("pipelined", "thread")
THREAD_ROWS = 16  # the thread order's floor: at 8 rows its extra GIL hand-offs lost on an H100


VISION_BATCH_PIXELS = 4 * 1920 * 1080  # four full-HD screenshots


@dataclass
class EngineConfig:
    """The engine's knobs. The batched-step ones follow mlx-lm's BatchGenerator defaults,
    derived from the engine's row cap."""

    batch: int = field(default=8, metadata={"help": "rows decoded at once (the admission cap)"})
    prefill_batch_size: int | None = field(
        default=None, metadata={"help": "rows prefilled together; None: min(batch, 8)"}
    )
    prefill_step_size: int = field(default=2048, metadata={"help": "tokens per prefill chunk"})
    completion_batch_size: int | None = field(
        default=None, metadata={"help": "BatchGenerator's decode batch; None: batch"}
    )
    max_queue: int = field(
        default=1024, metadata={"help": "requests waiting before Overloaded (429)"}
    )
    kv_budget: int | None = field(
        default=None, metadata={"help": "bytes of KV cache the rows may hold; None: no cap"}
    )
    serial_fast_path: bool = field(
        default=True,
        metadata={"help": "a lone row runs mlx-lm's serial caches; off: every row batched"},
    )
    max_kv_size: int | None = field(
        default=None, metadata={"help": "one rotating KV size for every batched row"}
    )
    attention: str = field(
        default="mlx", metadata={"help": "the batched step's attention: mlx or folded(+fused)"}
    )
    clear_cache: bool = field(
        default=True,
        metadata={"help": "mx.clear_cache() after prefill chunks and finished rows (buffers)"},
    )
    decode_rows: bool = field(
        default=True, metadata={"help": "one-token steps over 2-D rows (the same kernels)"}
    )
    decode_fused: bool = field(
        default=False, metadata={"help": "a lone row's q/k/v and gate/up as one matmul each"}
    )
    batch_sampling: bool | None = field(
        default=None, metadata={"help": "rows' samplers in batched calls; None: where proven"}
    )
    prefill_tokens: int | None = field(
        default=None, metadata={"help": "a prefill wave's token budget; None: rows only"}
    )
    vision_batch_pixels: int = field(
        default=VISION_BATCH_PIXELS,
        metadata={"help": "pixels one vision tower call reads for requests waiting together"},
    )
    gil_phases: bool = field(
        default=False,
        metadata={"help": "the engine thread first at the GIL (--switch-interval engine)"},
    )
    step_order: str = field(
        default="pipelined",
        metadata={"help": "pipelined (mlx-lm's) or thread (a thread queues big batches' steps)"},
    )
    thread_rows: int = field(
        default=THREAD_ROWS,
        metadata={
            "help": "the fewest rows the thread order hands to its thread",
            "env": "MLXD_THREAD_ROWS",
        },
    )
    trace: str | None = field(
        default=None,
        metadata={"help": "a file: one JSON line per engine turn", "env": "MLXD_TRACE"},
    )
    kernels: str | None = field(
        default=None,
        metadata={
            "help": "a file: the GPU kernels of a window of steps (CUDA)",
            "env": "MLXD_KERNELS",
        },
    )
    kernels_at: str = field(
        default="32 60 40",
        metadata={"help": '"ROWS START TURNS": the kernel window', "env": "MLXD_KERNELS_AT"},
    )

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError("batch must be >= 1")
        if self.vision_batch_pixels < 1:
            raise ValueError(f"vision_batch_pixels={self.vision_batch_pixels}: 1 or more")
        if self.step_order not in STEP_ORDERS:
            raise ValueError(f"step order {self.step_order!r}: one of {', '.join(STEP_ORDERS)}")
        if self.thread_rows < 1:
            raise ValueError(f"thread_rows={self.thread_rows}: a row count, 1 or more")
        try:
            rows, start, turns = (int(x) for x in self.kernels_at.split())
        except ValueError:
            raise ValueError(
                f'kernels_at={self.kernels_at!r}: "ROWS START TURNS", three integers'
            ) from None

    @property
    def completion_batch(self) -> int:
        return self.completion_batch_size or self.batch

    @property
    def prefill_batch(self) -> int:
        return self.prefill_batch_size or min(self.batch, 8)


def _env_value(name: str, kind: type, text: str) -> object:
    if kind is int:
        if not text.strip().isdigit():
            raise ValueError(f"{name}={text!r}: a whole number")
        return int(text)
    return text


def from_env(config: EngineConfig, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """`config` with each field that names an environment variable taken from it, where set and
    the field is at its default (an explicit setting wins)."""
    environ = os.environ if environ is None else environ
    for f in fields(config):
        name = f.metadata.get("env")
        if name and name in environ and getattr(config, f.name) == f.default:
            kind = int if isinstance(f.default, int) and not isinstance(f.default, bool) else str
            try:
                config = replace(config, **{f.name: _env_value(name, kind, environ[name])})
            except ValueError as e:  # one line naming the variable
                raise ValueError(str(e) if name in str(e) else f"{name}: {e}") from None
    return config


# ---- Process-wide settings read from the environment -----------------------------------------

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the embedded model `--model` defaults to

# Every environment variable mlxd reads (the MLX_* ones it only writes, for MLX to read).
ENV_VARS = {
    "MLXD_HOME": "where mlxd keeps converted models, the default model and stored responses "
    "(default: ~/.cache/mlxd)",
    "MLXD_API_KEY": "`mlxd serve --api-key`'s default",
    "MLXD_ISOLATION": "`mlxd serve --isolation`'s default (process or off)",
    "HF_HUB_OFFLINE": "1, true, yes or on: resolve Hugging Face repo ids from the local cache only",
    "MLXD_THREAD_ROWS": "EngineConfig.thread_rows",
    "MLXD_TRACE": "EngineConfig.trace",
    "MLXD_KERNELS": "EngineConfig.kernels",
    "MLXD_KERNELS_AT": "EngineConfig.kernels_at",
    "MLXD_GEMV_PARTS": "the projections `--batched-attention folded+fused+gemv` routes, "
    "comma-separated, of qkv, o, gate_up, down, head, qk (default: qkv,o,gate_up,down)",
    "MLXD_GEMV_ROWS": "rows up to which that mode's step takes the gemv (default: 8)",
    "MLXD_GEMV_MAX_MB": "the largest weight, in MB, that mode routes (default: 16)",
    "MLXD_BLAS": "the CPU backend's BLAS on Linux: reference (default: MLX's own, the bits of a "
    "stock mlx-lm), auto (the first of OpenBLAS, BLIS or MKL found: float32 matmuls ~15-20x "
    "faster, other bits) or a library's path",
}
GEMV_PARTS = ("qkv", "o", "gate_up", "down", "head", "qk")


def mlxd_home(create: bool = True) -> Path:
    """`MLXD_HOME`, else `~/.cache/mlxd` (created on first use unless `create` is off)."""
    root = os.environ.get("MLXD_HOME")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "mlxd"
    if create:
        private_dir(path)
    return path


def private_dir(path: Path) -> Path:
    """`path`, made if missing and then readable by its owner alone (0700): mlxd's data folders
    hold prompts, replies and converted weights. A folder that exists is left as it is (it
    may be the user's own choice, or not theirs to change)."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
    return path


def blas_choice() -> str:
    """MLXD_BLAS: reference (the default), auto or a path (mlxd/blas.py)."""
    return os.environ.get("MLXD_BLAS", "").strip() or "reference"


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def child_environment(pythonpath: str) -> dict[str, str]:
    """This process's environment for a child process, `pythonpath` first on its path (the
    benchmark's servers run the mlxd that started them)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return env


def cudnn_attention() -> bool:
    """Whether MLX-CUDA's cuDNN attention is on (MLX reads MLX_CUDA_USE_CUDNN_SDPA itself;
    `--cudnn-attention off` writes it)."""
    return os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1").strip() != "0"


@dataclass(frozen=True)
class GemvTuning:
    """The `+gemv` attention mode's probe knobs (MLXD_GEMV_*)."""

    parts: frozenset[str]
    rows: int
    max_bytes: int


def gemv_tuning() -> GemvTuning:
    env = os.environ
    parts = env.get("MLXD_GEMV_PARTS")
    return GemvTuning(
        frozenset(GEMV_PARTS[:4] if parts is None else parts.split(",")),
        int(env.get("MLXD_GEMV_ROWS", "8")),
        int(env.get("MLXD_GEMV_MAX_MB", "16")) << 20,
    )


# ---- `mlxd serve` ---------------------------------------------------------------------------


class ConfigError(ValueError):
    """A bad setting: its message is one line naming the flag (or file option, or variable)."""


ATTENTION_MODES = ("mlx", "folded", "folded+fused", "folded+fused+gemv")
MODEL, KV, ENGINE, SAMPLING, SERVER = (
    "model (L1)",
    "KV cache (L2) and prompt store (L0)",
    "engine (L3)",
    "sampling defaults (L3)",
    "server (L4)",
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _wave_tokens(value: str | int) -> int:
    """`--prefill-batch-tokens`: a token count, or auto (-1: resolved with the other flags)."""
    if value == "auto":
        return -1
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0 or isinstance(value, bool):
        raise argparse.ArgumentTypeError("must be auto or a token count >= 0")
    return n


def _seconds(value: str | float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _switch_interval(value: str | float) -> float | str:
    if value == "engine":
        return value
    seconds = _seconds(value)
    if not seconds > 0 or isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"'engine' or a positive number of seconds, not {value!r}")
    return seconds


def _window(value: str | float) -> float:
    seconds = _seconds(value)
    if not 0 <= seconds <= 10 or isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"seconds between 0 and 10, not {value!r}")
    return seconds


def _origins(text: str) -> list[str]:
    return text.split(",")


class _Names(argparse.Action):
    """`--served-model-name NAME [NAME ...]`: one or more non-empty names (vLLM's form)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("default", [])
        super().__init__(option_strings, dest, nargs="+", metavar="NAME", **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if any(not v or "\x00" in v for v in values):
            parser.error(f"{option}: a name is non-empty text")
        setattr(namespace, self.dest, self.joined(namespace, list(values)))

    def joined(self, namespace: Any, values: list[str]) -> list[str]:
        return values


class _Model(argparse.Action):
    """`--model`: the first is the default model, a repeat adds to --models."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if getattr(namespace, self.dest, None) is None:
            setattr(namespace, self.dest, values)
        else:
            namespace.models = [*(getattr(namespace, "models", None) or []), values]


class _Models(_Names):
    """`--models NAME [NAME ...]` or `--models auto`, added to any repeated --model."""

    def joined(self, namespace: Any, values: list[str]) -> list[str]:
        return [*(getattr(namespace, self.dest, None) or []), *values]


def lora_module(text: str) -> tuple[str, str]:
    """One `--lora-modules` entry, vLLM's two forms: `NAME=PATH` or the JSON object
    `{"name": ..., "path": ..., "base_model_name": ...}` (the base's name is not checked)."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{text!r} is not a JSON object ({e})") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{text!r} is not a JSON object")
        name, path = entry.get("name"), entry.get("path")
    else:
        name, _, path = text.partition("=")
    if not isinstance(name, str) or not isinstance(path, str) or not name.strip() or not path:
        raise ValueError(f'{text!r} is not NAME=PATH or {{"name": ..., "path": ...}}')
    if "\x00" in name + path or len(name) > 1024:
        raise ValueError(f"{text!r}: the name is not a model name")
    return name.strip(), path


class _LoraModules(argparse.Action):
    """`--lora-modules NAME=PATH [NAME=PATH ...]` (vLLM's flag), each entry checked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("default", [])
        super().__init__(option_strings, dest, nargs="+", metavar="NAME=PATH", **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        for v in values:
            try:
                lora_module(v)
            except ValueError as e:
                parser.error(f"{option}: {e}")
        setattr(namespace, self.dest, [*getattr(namespace, self.dest, []), *values])


def _memory(text: str) -> str:
    """`--memory-budget`: bytes ("24GB") or a share of the machine's memory ("75%"), checked;
    kept as text (a share is resolved where the machine's memory is known)."""
    text = text.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a percentage") from None
        if not 0 < pct <= 100:
            raise argparse.ArgumentTypeError("a percentage must be in (0, 100]")
        return text
    try:
        _parse_size(text)
    except (ValueError, KeyError, ArithmeticError):
        raise argparse.ArgumentTypeError(f"cannot read '{text}' as a size") from None
    return text


def flag(default: Any, *flags: str, group: str, help: str, **more: Any) -> Any:
    """A field with its flag: option strings, `--help` group and text, and argparse's `parse`
    (type), `choices`, `metavar`, `action`; `text`: the default as typed on a command line,
    where the field's is what `parse` makes of it; `env`: the variable it defaults to;
    `engine`: the EngineConfig fields it sets."""
    meta = {"flags": flags, "group": group, "help": help, **more}
    if isinstance(default, list | dict):  # each config its own copy
        return field(default_factory=lambda: copy.copy(default), metadata=meta)
    return field(default=default, metadata=meta)


KV_CONFIG_HELP = (
    "mixed per-layer KV quantization from mlx-optiq's kv_config.json (a list of "
    "{layer_idx, bits, group_size}); unnamed layers stay unquantized. Excludes --kv-bits"
)


@dataclass(frozen=True)
class ServeConfig:
    """`mlxd serve`'s settings: one field per flag (a `--config` file's keys are these names),
    and `engine`, the engine config they resolve to on this machine (`resolved()`)."""

    # model (L1)
    model: str | None = flag(None,
        "--model", group=MODEL, action=_Model,
        help="local model folder, Hugging Face repo id (local cache first) or .gguf file; "
        f"default: the embedded {DEFAULT_MODEL_NAME}. Repeated: the first is the default "
        "model, each other joins the pool (--models)",
    )  # fmt: skip
    models: list[str] = flag([],
        "--models", group=MODEL, action=_Models,
        help="more models served beside --model, each loaded on its first request: names as "
        "--model takes them, or `auto` (every model `mlxd models` lists as ready); a request's "
        "model picks one (docs/http-api.md, model pool)",
    )  # fmt: skip
    models_file: str | None = flag(None,
        "--models-file", group=MODEL, parse=str, metavar="PATH",
        help="a JSON list of models to serve: {\"name\", \"path\", \"aliases\": [...], "
        "\"pinned\": bool, \"ttl\": seconds, \"defaults\": {\"temperature\", ...}}; "
        "without --model the first is the default model",
    )  # fmt: skip
    model_ttl: float | None = flag(None,
        "--model-ttl", group=MODEL, parse=float, metavar="SECONDS",
        help="unload a pool model idle this long (no running or queued rows); pinned models "
        "and the default model stay (default: none, models stay loaded)",
    )  # fmt: skip
    # None (a config built in Python, not parsed by `mlxd serve`): the engine in this process.
    isolation: str | None = flag(None,
        "--isolation", group=MODEL, choices=("process", "off"),
        help="process (the default, or MLXD_ISOLATION): each served model's engine runs in a "
        "child process, so a crash in MLX ends that engine's requests with an error and the "
        "engine restarts while the server keeps serving; off: in the server's process",
    )  # fmt: skip
    adapter_path: str | None = flag(None,
        "--adapter-path", group=MODEL, parse=str,
        help="Optional path for the trained adapter weights and config.",
    )  # fmt: skip
    draft_model: str | None = flag(None,
        "--draft-model", group=MODEL, parse=str,
        help="A model for speculative decoding (mlx-lm's speculative_generate_step: requests "
        "that draft with it run one at a time, as in mlx_lm.server, unless --speculative draft; "
        "a request's `draft_model` null turns it off)",
    )  # fmt: skip
    num_draft_tokens: int = flag(3,
        "--num-draft-tokens", group=MODEL, parse=int,
        help="Tokens to draft per step with --draft-model (a request's `num_draft_tokens` "
        "overrides it).",
    )  # fmt: skip
    trust_remote_code: bool = flag(False,
        "--trust-remote-code", group=MODEL, action="store_true",
        help="Enable trusting remote code for tokenizer",
    )  # fmt: skip
    chat_template: str = flag("",
        "--chat-template", group=MODEL, parse=str,
        help="Specify a chat template for the tokenizer",
    )  # fmt: skip
    use_default_chat_template: bool = flag(False,
        "--use-default-chat-template", group=MODEL, action="store_true",
        help="Use the default chat template",
    )  # fmt: skip
    allow_model_paths: bool = flag(False,
        "--allow-model-paths", group=MODEL, action="store_true",
        help="let a request's model or adapters name any local path or Hugging Face repo, "
        "downloading it if needed (mlx_lm.server's behaviour); off: only the served model, "
        "its aliases and models already in the local Hugging Face cache",
    )  # fmt: skip
    served_model_name: list[str] = flag([],
        "--served-model-name", group=MODEL, action=_Names,
        help="the served model's names (vLLM's flag): the first is the id /v1/models lists, "
        "every one is accepted in a request's model (default: the --model value, or the "
        f"embedded {DEFAULT_MODEL_NAME})",
    )  # fmt: skip
    strict_model_names: bool = flag(False,
        "--strict-model-names", group=MODEL, action="store_true",
        help="answer 404 to a request naming a model the server does not serve; off: a "
        "bare name an agent tool sends (gpt-4o, claude-sonnet-4-5) means the served model, "
        "as /v1/messages takes any name (docs/http-api.md, model names)",
    )  # fmt: skip
    lora_modules: list[str] = flag([],
        "--lora-modules", group=MODEL, action=_LoraModules,
        help="LoRA adapters served beside the model (vLLM's flag): NAME=PATH or "
        "'{\"name\": ..., \"path\": ...}' per adapter (mlx-lm or PEFT folders); a request's "
        "model NAME runs its row with that adapter on the served model's engine, and "
        "/v1/models lists each with `parent` (docs/http-api.md, LoRA adapters)",
    )  # fmt: skip
    max_loras: int = flag(8,
        "--max-loras", group=MODEL, parse=int,
        help="adapters resident at once (vLLM's flag); loading one more evicts the least "
        "recently used one no row is using, and is refused (503) while every one is in use",
    )  # fmt: skip
    chat_template_args: dict[str, Any] = flag({},
        "--chat-template-args", group=MODEL, parse=json.loads, text="{}",
        help="JSON arguments for the tokenizer's apply_chat_template, e.g. "
        "'{\"enable_thinking\":false}'",
    )  # fmt: skip

    # KV cache (L2) and prompt store (L0)
    kv_bits: int | None = flag(None,
        "--kv-bits", group=KV, parse=int, help="KV cache quantization bits (4 or 8)",
    )  # fmt: skip
    kv_group_size: int = flag(64,
        "--kv-group-size", group=KV, parse=int, help="KV quantization group size",
    )  # fmt: skip
    quantized_kv_start: int = flag(DEFAULT_QUANTIZED_KV_START,
        "--quantized-kv-start", group=KV, parse=int,
        help="Token position to start KV quantization (default: "
        f"{DEFAULT_QUANTIZED_KV_START}; with --kv-config it means 0, as optiq serve)",
    )  # fmt: skip
    kv_config: str | None = flag(None,
        "--kv-config", group=KV, parse=str, metavar="PATH", help=KV_CONFIG_HELP,
    )  # fmt: skip
    prompt_cache_size: int = flag(10,
        "--prompt-cache-size", group=KV, parse=int,
        help="Maximum number of distinct KV caches in the prompt cache",
    )  # fmt: skip
    prompt_cache_bytes: int | None = flag(None,
        "--prompt-cache-bytes", group=KV, parse=_parse_size,
        help="Maximum size in bytes of the KV caches",
    )  # fmt: skip
    ssd_cache: str | None = flag(None,
        "--ssd-cache", group=KV, parse=str, metavar="DIR",
        help="keep prompt caches on disk in DIR too: they survive restarts and RAM evictions",
    )  # fmt: skip
    ssd_cache_max: int = flag(32 * 10**9,
        "--ssd-cache-max", group=KV, parse=_parse_size, text="32GB",
        help="maximum bytes of the disk tier (least recently used files go first)",
    )  # fmt: skip
    ssd_demote_idle: float = flag(300.0,
        "--ssd-demote-idle", group=KV, parse=float, metavar="SECONDS",
        help="with --ssd-cache: prompt caches unused this long leave RAM for disk",
    )  # fmt: skip
    prefix_deterministic: bool = flag(False,
        "--prefix-deterministic", group=KV, action="store_true",
        help="a prompt-cache hit gives the same bits as a miss: prefill chunks and hits on a "
        "fixed grid of --prefill-step-size tokens, for rows prefilled alone",
    )  # fmt: skip

    # engine (L3)
    batch: int | None = flag(None,
        "--batch", "--decode-concurrency", group=ENGINE, parse=int, engine="batch",
        help="maximum concurrent rows; more requests wait in the queue (default: 8, and 32 on "
        "NVIDIA GPUs, where 32 agents on 8 rows waited 3x longer for a first token than on 32)",
    )  # fmt: skip
    prompt_concurrency: int = flag(8,
        "--prompt-concurrency", group=ENGINE, parse=int, engine="prefill_batch_size",
        help="prompts prefilled together when they join the batch (default: 8)",
    )  # fmt: skip
    prefill_batch_tokens: int = flag(-1,
        "--prefill-batch-tokens", group=ENGINE, parse=_wave_tokens, text="auto",
        engine="prefill_tokens",
        help="more prompts prefill together than --prompt-concurrency while rows x the longest "
        "chunk stays within this many tokens, so agents coming back at once join in one wave, "
        "not one per 8 rows (H200, 32 agents on an 8B model: 1.27x tok/s); auto (default): "
        "--prompt-concurrency x --prefill-step-size, mlx-lm's largest wave; 0: mlx-lm's count",
    )  # fmt: skip
    vision_batch_pixels: int = flag(VISION_BATCH_PIXELS,
        "--vision-batch-pixels", group=ENGINE, parse=int, engine="vision_batch_pixels",
        help="image requests that arrive together run the vision tower in one call over as many "
        "of their images as fit this many pixels, as the processor sized them (a request's "
        "images stay in one call; the first always runs) (default: 8294400, four 1920x1080)",
    )  # fmt: skip
    prefill_step_size: int = flag(2048,
        "--prefill-step-size", group=ENGINE, parse=int, engine="prefill_step_size",
        help="prompt tokens per prefill chunk",
    )  # fmt: skip
    batched_attention: str = flag("mlx",
        "--batched-attention", group=ENGINE, choices=ATTENTION_MODES, engine="attention",
        help="attention of the batched decode step: mlx (MLX's, the same bits as mlx-lm) or "
        "folded (no masked fallback: much faster on CUDA at long contexts, changes bits there; "
        "llama, mistral, qwen2, qwen3, qwen3_moe; keep mlx on Metal) or folded+fused (also "
        "q/k/v and gate/up as one matmul each: fewer kernel calls on CUDA, those weights "
        "stacked in place, no memory added)",
    )  # fmt: skip
    decode_step: str = flag("rows",
        "--decode-step", group=ENGINE, choices=("rows", "rows+fused", "mlx"),
        engine="decode_rows, decode_fused",
        help="the one-token decode step of a lone request and of --batched-attention mlx's "
        "batch: rows (mlx-lm's kernels over 2-D rows, ~23 fewer view nodes a layer for llama, "
        "mistral, qwen2, qwen3, qwen3_moe, gemma3 and phi3 models with unquantized weights: less "
        "host time a token, the same bits), rows+fused (rows, and a lone row's q/k/v and "
        "gate/up as one matmul each: the same bits on CUDA and the CPU, not checked on Metal; "
        "the weights stacked in place, no memory added; opt-in until measured) or mlx (mlx-lm's "
        "model call as it is)",
    )  # fmt: skip
    prefill_clear_cache: str = flag("auto",
        "--prefill-clear-cache", group=ENGINE, choices=("auto", "on", "off"), engine="clear_cache",
        help="mx.clear_cache() after each prefill chunk, as mlx-lm does, and when a row or a "
        "batch ends (auto: off on CUDA, where a clear costs 0.1-0.4 s with an 8B model's "
        "buffers; on elsewhere; same bits; without clears the cache grows to MLX's memory "
        "limit, which --memory-budget sets)",
    )  # fmt: skip
    batched_sampling: str = flag("auto",
        "--batched-sampling", group=ENGINE, choices=("auto", "on", "off"),
        engine="batch_sampling",
        help="sample batched rows whose samplers differ (every request with a temperature) in "
        "a few batched calls, each row with its own draw: mlx-lm's tokens, tested on the CPU "
        "and MLX-CUDA (auto: on there; off on Metal until run there)",
    )  # fmt: skip
    cuda_graphs: str = flag("on",
        "--cuda-graphs", group=ENGINE, choices=("on", "off"),
        help="MLX-CUDA's graph capture (MLX_USE_CUDA_GRAPHS): on is faster for a lone row and, "
        "with the thread step order, for 32 rows too (1.01-1.03x off's tok/s on an H100); off "
        "was faster at 32 rows before that order (docs/cli.md)",
    )  # fmt: skip
    cudnn_attention: str = flag("on",
        "--cudnn-attention", group=ENGINE, choices=("on", "off"),
        help="MLX-CUDA's cuDNN attention for prefill (MLX_CUDA_USE_CUDNN_SDPA): cuDNN builds a "
        "graph per new shape, so a lone join's prefill took 0.093 s at the median on an H200 "
        "against 0.026 s off; off uses MLX's own kernels, whose bits differ from mlx_lm.server's",
    )  # fmt: skip
    switch_interval: float | str | None = flag(None,
        "--switch-interval", group=ENGINE, parse=_switch_interval, engine="gil_phases",
        help="seconds a thread may hold the GIL while another waits for it (Python's "
        "sys.setswitchinterval; default: Python's 0.005), or 'engine': Python's while the "
        "engine builds a batched step, 0.2 ms around its device waits and while a lone row "
        "decodes (engine/overlap.py)",
    )  # fmt: skip
    step_order: str | None = flag(None,
        "--step-order", group=ENGINE, choices=STEP_ORDERS, engine="step_order",
        help="when a batched decode step is queued: pipelined (mlx-lm's, a step ahead) or "
        "thread (the first third of its layers queued before the last step's tokens are read, "
        "the rest after, on a thread of its own while the engine builds the next); the same "
        "bits. On an H100 thread decoded 32 agents 1.056x faster than pipelined on an 8B model "
        "(default: thread on NVIDIA GPUs and pipelined elsewhere)",
    )  # fmt: skip
    join_window: float = flag(0.25,
        "--join-window", group=ENGINE, parse=_window,
        help="seconds a new prefill wave may wait for requests the server has received and "
        "not yet queued (body, chat template, tokenizing), or for the next turns of replies "
        "that just ended, so an agent fleet's turns that arrive together prefill in one "
        "wave; a lone request never waits; 0: off "
        "(default: 0.25; same bits for a given batch, docs/performance.md)",
    )  # fmt: skip
    max_queue: int = flag(256,
        "--max-queue", group=ENGINE, parse=int, engine="max_queue",
        help="requests that may wait beyond the rows free now; past it: 429 with Retry-After, "
        "the queue's expected drain (default: 256)",
    )  # fmt: skip
    kv_budget: int | None = flag(None,
        "--kv-budget", group=ENGINE, parse=_parse_size, engine="kv_budget",
        help="bytes of KV cache the running rows may reserve (e.g. 8GB); a row waits until its "
        "worst case fits",
    )  # fmt: skip
    memory_budget: str | None = flag(None,
        "--memory-budget", group=ENGINE, parse=_memory, engine="kv_budget",
        help="total memory for weights and KV, in bytes or as a percentage of the machine's "
        "memory (e.g. 24GB or 75%); sets the KV budget to what the weights leave, and MLX's "
        "memory limit (past it, its buffer cache gives memory back)",
    )  # fmt: skip
    pipeline: bool = flag(False,
        "--pipeline", group=ENGINE, action="store_true",
        help="Use pipelining instead of tensor parallelism",
    )  # fmt: skip
    speculative: str = flag("off",
        "--speculative", group=ENGINE, choices=("off", "ngram", "draft"),
        help="how requests draft tokens by default, verified in the batched step (the same "
        "output, lossless): ngram looks up their own prompt and output, draft runs "
        "--draft-model for every drafting row at once; a request's `speculative` field "
        "overrides it, and a chat request's `prediction` (OpenAI's Predicted Outputs) drafts "
        "unless that field is off (default: off)",
    )  # fmt: skip
    num_speculative_tokens: int = flag(8,
        "--num-speculative-tokens", group=ENGINE, parse=int,
        help="the most tokens a row drafts per step in the batched step (ngram, prediction, "
        "draft; vLLM's name; default: 8)",
    )  # fmt: skip

    # sampling defaults (L3)
    temp: float = flag(0.0,
        "--temp", group=SAMPLING, parse=float, help="Default sampling temperature",
    )  # fmt: skip
    top_p: float = flag(1.0,
        "--top-p", group=SAMPLING, parse=float, help="Default nucleus sampling top-p",
    )  # fmt: skip
    top_k: int = flag(0,
        "--top-k", group=SAMPLING, parse=int, help="Default top-k sampling (0 disables)",
    )  # fmt: skip
    min_p: float = flag(0.0,
        "--min-p", group=SAMPLING, parse=float, help="Default min-p sampling (0 disables)",
    )  # fmt: skip
    max_tokens: int = flag(512,
        "--max-tokens", group=SAMPLING, parse=int, help="Default maximum tokens",
    )  # fmt: skip

    # server (L4)
    host: str = flag("127.0.0.1",
        "--host", group=SERVER, parse=str, help="Host (default: 127.0.0.1)",
    )  # fmt: skip
    port: int = flag(8080,
        "--port", group=SERVER, parse=int, help="Port (default: 8080)",
    )  # fmt: skip
    allowed_origins: list[str] = flag(["*"],
        "--allowed-origins", group=SERVER, parse=_origins, text="*",
        help="Allowed CORS origins, comma separated (default: *)",
    )  # fmt: skip
    max_request_bytes: int = flag(8 << 20,
        "--max-request-bytes", group=SERVER, parse=int,
        help="largest request body accepted; larger ones are 413 (default: 8 MiB)",
    )  # fmt: skip
    max_image_bytes: int = flag(20 << 20,
        "--max-image-bytes", group=SERVER, parse=int,
        help="largest encoded image a request may send (a data URL's or base64 block's bytes, "
        "a fetched or file image's); larger is a 400 naming the part (default: 20 MiB)",
    )  # fmt: skip
    max_image_pixels: int = flag(7680 * 4320,
        "--max-image-pixels", group=SERVER, parse=int,
        help="most pixels (width x height) an image may decode to, read from its header "
        "before decoding; more is a 400 (default: 33177600, 7680x4320)",
    )  # fmt: skip
    max_images_per_request: int = flag(16,
        "--max-images-per-request", group=SERVER, parse=int,
        help="images one request may carry, all its messages together (default: 16)",
    )  # fmt: skip
    allow_fetch: bool = flag(False,
        "--allow-fetch", group=SERVER, action="store_true",
        help="fetch http(s) image URLs a request names (no redirects, --max-image-bytes, a "
        "timeout); off: such a part is a 400 asking for a data URL",
    )  # fmt: skip
    allowed_media_dir: str | None = flag(None,
        "--allowed-media-dir", group=SERVER, parse=str, metavar="DIR",
        help="file:// image URLs may name files under this folder (symlinks resolved, none "
        "may lead out); unset: file URLs are a 400",
    )  # fmt: skip
    api_key: str | None = flag(None,
        "--api-key", group=SERVER, parse=str, env="MLXD_API_KEY",
        help="require this key on every endpoint but /health (default: $MLXD_API_KEY)",
    )  # fmt: skip
    data_dir: str | None = flag(None,
        "--data-dir", group=SERVER, parse=str, env="MLXD_HOME",
        help="where stored responses live (default: $MLXD_HOME/data)",
    )  # fmt: skip
    responses_max_stored: int = flag(10_000,
        "--responses-max-stored", group=SERVER, parse=int,
        help="stored responses (/v1/responses with store: true) kept at most; the oldest go "
        "first, and a previous_response_id naming one is a 404 (default: 10000; 0: no bound)",
    )  # fmt: skip
    responses_max_age: float = flag(30.0,
        "--responses-max-age", group=SERVER, parse=float, metavar="DAYS",
        help="stored responses older than this are deleted (default: 30, OpenAI's retention; "
        "0: kept until --responses-max-stored evicts them)",
    )  # fmt: skip
    config: str | None = flag(None,
        "--config", group=SERVER, parse=str,
        help='a JSON file of options (keys are flag names, e.g. {"batch": 16}); flags given '
        "on the command line win",
    )  # fmt: skip
    loop: str = flag("auto",
        "--loop", group=SERVER, choices=("auto", "asyncio", "uvloop"),
        help="event loop, as uvicorn's --loop (default: auto, uvloop where installed)",
    )  # fmt: skip
    http: str = flag("auto",
        "--http", group=SERVER, choices=("auto", "h11", "httptools"),
        help="HTTP parser, as uvicorn's --http (default: auto, httptools where installed)",
    )  # fmt: skip
    header_timeout: float = flag(10.0,
        "--header-timeout", group=SERVER, parse=float, metavar="SECONDS",
        help="a connection that has not sent a whole request head this long after it opened, "
        "or after its first byte of a next request, is answered 408 and closed (default: 10)",
    )  # fmt: skip
    body_timeout: float = flag(60.0,
        "--body-timeout", group=SERVER, parse=float, metavar="SECONDS",
        help="a request body that makes no progress this long is answered 408 and its "
        "connection closed (default: 60)",
    )  # fmt: skip
    request_timeout: float = flag(0.0,
        "--request-timeout", group=SERVER, parse=float, metavar="SECONDS",
        help="a request still running this long after it was submitted ends there: with the "
        "tokens it has, as if max_tokens were reached (finish_reason length, as llama.cpp's "
        "t_max_predict_ms), or, before its first token, a 429 with Retry-After; for servers "
        "untrusted clients reach (default: 0, no limit)",
    )  # fmt: skip
    max_connections: int = flag(512,
        "--max-connections", group=SERVER, parse=int,
        help="open connections at most (fewer when the file-descriptor limit leaves less "
        "room); past it the connection that has waited longest for a request head is closed, "
        "or, when every one is busy, the new one is answered 503 (default: 512)",
    )  # fmt: skip
    log_level: str = flag("INFO",
        "--log-level", group=SERVER, parse=str, choices=LOG_LEVELS,
        help="Set the logging level (default: INFO)",
    )  # fmt: skip
    log_format: str = flag("text",
        "--log-format", group=SERVER, parse=str, choices=("text", "json"),
        help="json: every log line is one JSON object (time, level, logger, message and a "
        "request line's fields), for log collectors (default: text)",
    )  # fmt: skip
    no_ui: bool = flag(False,
        "--no-ui", group=SERVER, action="store_true",
        help="serve no chat page at / and no dashboard at /dashboard (the API only)",
    )  # fmt: skip
    access_log: bool = flag(False,
        "--access-log", group=SERVER, action="store_true",
        help="also log uvicorn's access line per request (off: mlxd's own request line has "
        "its status and more, and says when a stream was cancelled)",
    )  # fmt: skip

    engine: EngineConfig | None = field(default=None, metadata={
        "help": "what the engine flags resolve to on this machine; None until `resolved()`",
    })  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            if "flags" in f.metadata:
                _check(f, getattr(self, f.name), _flag(f))
        if self.kv_config is not None and self.kv_bits is not None:
            raise ConfigError(
                "--kv-config and --kv-bits are mutually exclusive: pick one KV scheme"
            )
        for name in ("batch", "prompt_concurrency", "prefill_step_size", "vision_batch_pixels"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ConfigError(f"{_flag(_field(name))}: must be 1 or more, not {value}")
        checks = (  # what the flags' parsers make: -1 is auto's token count
            ("prefill_batch_tokens", self.prefill_batch_tokens >= -1),
            ("join_window", 0 <= self.join_window <= 10),
            ("responses_max_stored", self.responses_max_stored >= 0),
            ("responses_max_age", 0 <= self.responses_max_age < float("inf")),
            ("header_timeout", self.header_timeout > 0),
            ("body_timeout", self.body_timeout > 0),
            ("request_timeout", 0 <= self.request_timeout < float("inf")),
            ("max_connections", self.max_connections >= 1),
            ("max_image_bytes", self.max_image_bytes >= 1),
            ("max_image_pixels", self.max_image_pixels >= 1),
            ("max_images_per_request", self.max_images_per_request >= 1),
            ("num_speculative_tokens", self.num_speculative_tokens >= 1),
            ("isolation", self.isolation in (None, "process", "off")),
            ("switch_interval", self.switch_interval in (None, "engine")
             or isinstance(self.switch_interval, float) and self.switch_interval > 0),
        )  # fmt: skip
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"{_flag(_field(name))}: {getattr(self, name)!r} is out of range")
        if self.model_ttl is not None and not 0 < self.model_ttl < float("inf"):
            raise ConfigError(f"--model-ttl: a positive number of seconds, not {self.model_ttl}")
        if self.max_loras < 1:
            raise ConfigError(f"--max-loras: must be 1 or more, not {self.max_loras}")
        names = []
        for entry in self.lora_modules:
            try:
                names.append(lora_module(entry)[0])
            except ValueError as e:
                raise ConfigError(f"--lora-modules: {e}") from None
        if len(set(names)) < len(names):
            raise ConfigError(f"--lora-modules: a name is given twice ({', '.join(names)})")
        if len(names) > self.max_loras:
            raise ConfigError(
                f"--lora-modules gives {len(names)} adapters but --max-loras is {self.max_loras}"
            )
        if self.memory_budget is not None:
            try:
                _memory(self.memory_budget)
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"--memory-budget: {e}") from None

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> "ServeConfig":
        """The config of a parsed `mlxd serve` command line: its flags, then the `--config`
        file's options where a flag was left at its default, then the environment's defaults."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if "flags" in f.metadata}
        if values.get("config"):
            for name, value in read_config_file(values["config"]).items():
                if values[name] == cli_default(_field(name)):
                    values[name] = value
        environ = os.environ if environ is None else environ
        if values["api_key"] is None:
            values["api_key"] = environ.get("MLXD_API_KEY") or None
        if values["isolation"] is None:
            values["isolation"] = environ.get("MLXD_ISOLATION", "").strip() or "process"
        if values["data_dir"] is None:
            values["data_dir"] = str(mlxd_home(create=False) / "data")
        try:
            from_env(EngineConfig(), environ)  # the engine's variables, checked before any work
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return cls(**values)

    @property
    def quantize_from(self) -> int:
        """--quantized-kv-start as rows use it: with --kv-config, mlx-lm's default means 0
        (optiq serve's default, so the two give the same bits)."""
        if self.kv_config is not None and self.quantized_kv_start == DEFAULT_QUANTIZED_KV_START:
            return 0
        return self.quantized_kv_start

    def resolved(self, environ: Mapping[str, str] | None = None) -> "ServeConfig":
        """This config with `engine` set for this machine: asks MLX for CUDA, so call it after
        `apply_to_process` (MLX reads its CUDA switches once)."""
        if self.engine is not None:
            return self
        cuda = _cuda()
        batch = self.batch if self.batch is not None else default_batch()
        wave = min(batch, self.prompt_concurrency)
        if self.prefill_batch_tokens == 0:
            wave_tokens = None
        elif self.prefill_batch_tokens < 0:  # mlx-lm's largest wave: peak prefill memory as it was
            wave_tokens = wave * self.prefill_step_size
        else:
            wave_tokens = self.prefill_batch_tokens
        clear = self.prefill_clear_cache
        engine = EngineConfig(
            batch=batch,
            prefill_batch_size=wave,
            prefill_step_size=self.prefill_step_size,
            max_queue=self.max_queue,
            kv_budget=self.kv_budget,
            attention=self.batched_attention,
            clear_cache=not cuda if clear == "auto" else clear == "on",
            decode_rows=self.decode_step != "mlx",
            decode_fused=self.decode_step == "rows+fused",
            batch_sampling={"on": True, "off": False}.get(self.batched_sampling),
            prefill_tokens=wave_tokens,
            vision_batch_pixels=self.vision_batch_pixels,
            gil_phases=self.switch_interval == "engine",
            step_order=self.step_order or ("thread" if cuda else "pipelined"),
        )
        return replace(self, engine=from_env(engine, environ))


def default_batch() -> int:
    """8 rows (mlxd's cap on a Mac and the CPU); 32 on CUDA, mlx_lm.server's cap: a large GPU
    decodes 32 rows in about the time of 8 (docs/performance.md, the default row cap)."""
    return 32 if _cuda() else 8


def _cuda() -> bool:
    import mlx.core as mx

    return mx.cuda.is_available()


def apply_to_process(config: ServeConfig) -> None:
    """What must be set before MLX's first GPU command and before any thread starts: MLX's
    CUDA switches (read once by MLX) and Python's GIL switch interval."""
    if config.cuda_graphs == "off":
        os.environ["MLX_USE_CUDA_GRAPHS"] = "0"
    if config.cudnn_attention == "off":
        os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "0"
    if isinstance(config.switch_interval, float):
        sys.setswitchinterval(config.switch_interval)


def _field(name: str) -> Any:
    return next(f for f in fields(ServeConfig) if f.name == name)


def _flag(f: Any) -> str:
    return f.metadata["flags"][0]


def cli_default(f: Any) -> Any:
    """The field's default as argparse gives it (`text` parsed, as argparse parses it)."""
    if "text" in f.metadata:
        return f.metadata["parse"](f.metadata["text"])
    return f.default if f.default is not MISSING else f.default_factory()


def _kinds(tp: Any) -> tuple[type, ...]:
    args = typing.get_args(tp) if isinstance(tp, types.UnionType) else (tp,)
    return tuple(typing.get_origin(a) or a for a in args)


def _check(f: Any, value: Any, where: str) -> None:
    kinds = _kinds(f.type)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        if not (float in kinds and type(value) is int):  # JSON's 1 for 1.0
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"{where}: {value!r} is not {names}")
    choices = f.metadata.get("choices")
    if choices is not None and value is not None and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def read_config_file(path: str) -> dict[str, Any]:
    """`--config FILE`: a JSON object whose keys are flag names (`max-queue`, `max_queue` or
    `decode-concurrency`); each value checked and parsed as its flag's would be."""
    try:
        options = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the config file ({e})") from e
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: the config file must hold a JSON object")
    by_flag = {flag: f for f in fields(ServeConfig) for flag in f.metadata.get("flags", ())}
    out: dict[str, Any] = {}
    for key, value in options.items():
        f = by_flag.get("--" + key.replace("_", "-"))
        if f is None or f.name == "config":
            raise ConfigError(f"{path}: unknown option '{key}'")
        parse = f.metadata.get("parse")
        if isinstance(value, str) and parse not in (None, str):
            try:
                value = parse(value)
            except (ValueError, KeyError, ArithmeticError, argparse.ArgumentTypeError) as e:
                raise ConfigError(f"{path}: '{key}' ({_flag(f)}): {e}") from None
        elif parse is _memory and type(value) is int:  # bytes
            value = str(value)
        elif value is not None and parse in (_wave_tokens, _switch_interval, _window):
            try:
                value = parse(value)
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"{path}: '{key}' ({_flag(f)}): {e}") from None
        _check(f, value, f"{path}: '{key}' ({_flag(f)})")
        out[f.name] = float(value) if float in _kinds(f.type) and type(value) is int else value
    return out


# ---- docs/configuration.md -------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """Every setting as Markdown: docs/configuration.md is this text (`mlxd config` prints it;
    a test fails when the two differ)."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `mlxd config` from mlxd/config.py; tests/cli/test_configuration_doc.py"
        " fails when they differ. -->",
        "",
        "Every setting mlxd reads is a typed field of one dataclass in `mlxd/config.py`, resolved",
        "there and nowhere else:",
        "",
        "- `ServeConfig`: `mlxd serve`'s settings, one field per flag. `--config FILE` is a JSON",
        "  object whose keys are the flag names (`max-queue` or `max_queue`); its values fill the",
        "  flags left at their defaults on the command line, and text values read as the flag",
        '  reads them (`"8GB"`, `"auto"`). A bad value stops `mlxd serve` with one line naming',
        "  the flag. Defaults below are as a config file would write them.",
        "- `EngineConfig`: the engine's, for the Python API (`Engine(model, config=EngineConfig(",
        "  ...))`) and for each served model, where the engine flags resolve to it for the",
        "  machine (`ServeConfig.resolved()`).",
        "- A few environment variables, listed last.",
        "",
        "## `mlxd serve` (`ServeConfig`)",
    ]
    group = None
    for f in fields(ServeConfig):
        meta = f.metadata
        if "flags" not in meta:
            continue
        if meta["group"] != group:
            group = meta["group"]
            out += ["", f"### {group}", ""]
            out += ["| flag | field | type | default | env | help |", "|---|---|---|---|---|---|"]
        default = meta["text"] if "text" in meta else cli_default(f)
        flags = ", ".join(f"`{x}`" for x in meta["flags"])
        env = f"`{meta['env']}`" if "env" in meta else ""
        cells = (flags, f"`{f.name}`", _cell(f"`{_type_name(f.type)}`"), f"`{json.dumps(default)}`")
        out.append("| " + " | ".join((*cells, env, _cell(meta["help"]))) + " |")
    sets: dict[str, list[str]] = {}
    for f in fields(ServeConfig):
        if "engine" in f.metadata:
            for name in f.metadata["engine"].split(", "):
                sets.setdefault(name, []).append(f"`{f.metadata['flags'][0]}`")
    out += ["", "## The engine (`EngineConfig`)", ""]
    out += ["| field | type | default | env | `mlxd serve` flag | help |"]
    out += ["|---|---|---|---|---|---|"]
    for f in fields(EngineConfig):
        env = f"`{f.metadata['env']}`" if "env" in f.metadata else ""
        cells = (f"`{f.name}`", _cell(f"`{_type_name(f.type)}`"), f"`{f.default!r}`", env)
        by = ", ".join(sets.get(f.name, []))
        out.append("| " + " | ".join((*cells, by, _cell(f.metadata.get("help", "")))) + " |")
    out += ["", "## Environment variables", "", "| variable | what it sets |", "|---|---|"]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in ENV_VARS.items()]
    out += [
        "",
        "`mlxd serve` writes two of MLX's own variables before MLX starts: `MLX_USE_CUDA_GRAPHS=0`",
        "with `--cuda-graphs off`, `MLX_CUDA_USE_CUDNN_SDPA=0` with `--cudnn-attention off`.",
        "",
    ]
    return "\n".join(out)
