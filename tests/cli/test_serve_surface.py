"""`mlxd serve` takes every mlx_lm.server flag with its default (the row cap excepted: mlxd's
`--batch` default is 8, 32 on CUDA, and `--decode-concurrency` is its alias); help groups by
layer; a config file sets options; bad start-up options are one-line errors."""

import argparse
import json
from pathlib import Path

import mlx_lm.server
import pytest
from tests_helpers_serve import serve_parser

from mlxd.cli import build_parser
from mlxd.cli.serve import parse_config
from mlxd.config import ConfigError


class _Captured(Exception):
    pass


def mlx_lm_server_parser() -> argparse.ArgumentParser:
    """mlx_lm.server builds its parser inside main(): stop it at parse_args and keep it."""
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def grab(self, *args, **kwargs):
        captured.append(self)
        raise _Captured

    argparse.ArgumentParser.parse_args = grab  # test-only; restored below
    try:
        with pytest.raises(_Captured):
            mlx_lm.server.main()
    finally:
        argparse.ArgumentParser.parse_args = original
    return captured[0]


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def test_every_mlx_lm_server_flag_with_its_default() -> None:
    theirs = _actions(mlx_lm_server_parser())
    ours = _actions(serve_parser())
    renamed = {"decode_concurrency": "batch"}
    missing = {renamed.get(d, d) for d in theirs} - set(ours)
    assert not missing, f"missing: {sorted(missing)}"
    for dest, a in theirs.items():
        b = ours[renamed.get(dest, dest)]
        assert set(a.option_strings) <= set(b.option_strings), dest
        if dest == "decode_concurrency":
            assert (a.default, b.default) == (32, None)  # resolved per platform at start-up
            continue
        # allowed-origins: mlx-lm's type is a lambda; compare what it makes of a value.
        if dest == "allowed_origins":
            assert a.type("a,b") == b.type("a,b") and a.default == b.default
            continue
        # prompt-cache-bytes: ours calls mlx-lm's parser when used (config.py imports no mlx).
        if dest == "prompt_cache_bytes":
            assert a.type("32GB") == b.type("32GB") and a.default == b.default
            assert (a.nargs, type(a)) == (b.nargs, type(b))
            continue
        # model: ours may be repeated (the first is the default, the others join --models).
        if dest == "model":
            assert (a.default, b.default, a.type) == (None, None, str)
            ns = argparse.Namespace(model=None, models=[])
            b(None, ns, "x")
            b(None, ns, "y")
            assert (ns.model, ns.models) == ("x", ["y"])
            continue
        assert (a.default, a.type, a.nargs, type(a)) == (b.default, b.type, b.nargs, type(b)), dest


def test_row_cap_default_is_8_and_32_on_cuda(monkeypatch) -> None:
    import mlx.core as mx

    from mlxd.config import default_batch

    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    assert default_batch() == 8
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    assert default_batch() == 32


def test_help_groups_flags_by_layer() -> None:
    text = serve_parser().format_help()
    for title in ("model (L1)", "(L2)", "engine (L3)", "server (L4)"):
        assert title in text


def test_config_file_sets_options_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"decode-concurrency": 16, "max_queue": 4, "port": 9000}))
    config = parse_config(["--config", str(cfg), "--port", "9100"])
    assert (config.batch, config.max_queue, config.port) == (16, 4, 9100)
    cfg.write_text(json.dumps({"no_such_option": 1}))
    with pytest.raises(ConfigError, match="unknown option 'no_such_option'"):
        parse_config(["--config", str(cfg)])


def test_config_file_values_read_as_their_flags_read_text(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.json"
    options = {
        "kv-budget": "8GB",
        "allowed_origins": "a,b",
        "prefill-batch-tokens": "auto",
        "switch-interval": 0.001,
        "chat-template-args": '{"enable_thinking": false}',
    }
    cfg.write_text(json.dumps(options))
    c = parse_config(["--config", str(cfg)])
    assert (c.kv_budget, c.allowed_origins, c.prefill_batch_tokens) == (8 * 10**9, ["a", "b"], -1)
    assert c.switch_interval == 0.001 and c.chat_template_args == {"enable_thinking": False}


@pytest.mark.parametrize(
    "options,message",
    [({"max_queue": "many"}, r"'max_queue' \(--max-queue\): invalid literal"),
     ({"batch": True}, r"--batch\): True is not int or null"),
     ({"step-order": "wait"}, r"--step-order\): 'wait' is not one of pipelined, thread"),
     ({"join-window": 11}, r"--join-window\): seconds between 0 and 10"),
     ({"memory-budget": "75 apples"}, r"--memory-budget\): cannot read"),
     ({"config": "other.json"}, "unknown option 'config'")],
)  # fmt: skip
def test_a_bad_config_file_value_is_one_line_naming_the_flag(tmp_path, options, message) -> None:
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps(options))
    with pytest.raises(ConfigError, match=message):
        parse_config(["--config", str(cfg)])


@pytest.mark.parametrize(
    "flags,message",
    [(["--kv-config", "x.json", "--kv-bits", "4"], "--kv-config and --kv-bits are mutually"),
     (["--batch", "0"], "--batch: must be 1 or more"),
     (["--prompt-concurrency", "0"], "--prompt-concurrency: must be 1 or more")],
)  # fmt: skip
def test_bad_flag_combinations_stop_serve_with_one_line(flags, message, monkeypatch) -> None:
    import mlxd.serve.main as serve_main
    from mlxd.cli import serve as serve_cli

    monkeypatch.setattr(serve_main, "serve", lambda a, **_: pytest.fail("served"))
    with pytest.raises(SystemExit, match=f"mlxd serve: error: {message}"):
        serve_cli.run(build_parser().parse_args(["serve", *flags]))


def test_the_environment_gives_the_api_key_and_data_dir_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MLXD_API_KEY", "k1")
    monkeypatch.setenv("MLXD_HOME", str(tmp_path))
    config = parse_config([])
    assert (config.api_key, config.data_dir) == ("k1", str(tmp_path / "data"))
    config = parse_config(["--api-key", "k2", "--data-dir", "d"])
    assert (config.api_key, config.data_dir) == ("k2", "d")


def test_draft_model_starts(tmp_path: Path, tiny_model) -> None:
    """--draft-model loads beside the model and its engine drafts with it; a draft that does
    not load is the model's one-line error; --kv-config does not run with it."""
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    model, draft = str(tiny_model("qwen3")), str(tiny_model("qwen3", seed=1))
    base = ["--model", model, "--data-dir", str(tmp_path)]
    state = make_state(parse_config([*base, "--draft-model", draft]))
    try:
        served = state.provider.default
        assert served.draft_names[0] == draft
        assert served.engine.scheduler.draft_model is not None
    finally:
        state.provider.close()
    with pytest.raises(ModelLoadError) as e:
        make_state(parse_config([*base, "--draft-model", str(tmp_path / "missing")]))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelLoadError, match="--draft-model"):
        make_state(parse_config([*base, "--draft-model", draft, "--kv-config", "x.json"]))


@pytest.mark.parametrize(
    "flag,var,env",
    [
        ([], "MLX_USE_CUDA_GRAPHS", None),
        (["--cuda-graphs", "off"], "MLX_USE_CUDA_GRAPHS", "0"),
        ([], "MLX_CUDA_USE_CUDNN_SDPA", None),
        (["--cudnn-attention", "off"], "MLX_CUDA_USE_CUDNN_SDPA", "0"),
    ],
)
def test_mlx_cuda_switches_reach_mlx_before_the_server_starts(monkeypatch, flag, var, env) -> None:
    """MLX reads MLX_USE_CUDA_GRAPHS (and MLX_CUDA_USE_CUDNN_SDPA) once, at its first GPU
    command (attention call): the flag sets it before `serve` (which loads the model) runs;
    without the flag the environment is left alone."""
    import os

    import mlxd.serve.main as serve_main
    from mlxd.cli import serve as serve_cli

    monkeypatch.setenv(var, "")  # so the test's end restores the original
    monkeypatch.delenv(var)
    seen: list[str | None] = []
    monkeypatch.setattr(serve_main, "serve", lambda a, **_: seen.append(os.environ.get(var)))
    serve_cli.run(build_parser().parse_args(["serve", *flag]))
    assert seen == [env]


@pytest.mark.parametrize("flag,interval", [([], None), (["--switch-interval", "0.0005"], 0.0005)])
def test_switch_interval_is_set_before_the_server_starts(monkeypatch, flag, interval) -> None:
    """--switch-interval sets Python's GIL switch interval before `serve` starts any thread;
    without it Python's own stays."""
    import sys

    import mlxd.serve.main as serve_main
    from mlxd.cli import serve as serve_cli

    before = sys.getswitchinterval()
    seen: list[float] = []
    monkeypatch.setattr(serve_main, "serve", lambda a, **_: seen.append(sys.getswitchinterval()))
    try:
        serve_cli.run(build_parser().parse_args(["serve", *flag]))
    finally:
        sys.setswitchinterval(before)
    assert seen == [before if interval is None else pytest.approx(interval)]


def test_switch_interval_engine_leaves_pythons_interval_to_the_engine(monkeypatch) -> None:
    import sys

    import mlxd.serve.main as serve_main
    from mlxd.cli import serve as serve_cli

    before = sys.getswitchinterval()
    seen: list = []
    monkeypatch.setattr(serve_main, "serve", lambda a, **_: seen.append(a.switch_interval))
    serve_cli.run(build_parser().parse_args(["serve", "--switch-interval", "engine"]))
    assert seen == ["engine"] and sys.getswitchinterval() == before


@pytest.mark.parametrize("value", ["0", "-1", "nan", "fast"])
def test_switch_interval_must_be_positive_seconds(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--switch-interval", value])
    assert "--switch-interval" in capsys.readouterr().err


@pytest.mark.parametrize("flags,window", [([], 0.25), (["--join-window", "0"], 0.0)])
def test_join_window_reaches_the_servers_arrivals(flags, window, tiny_model, tmp_path) -> None:
    from mlxd.serve.main import make_state

    model = str(tiny_model("qwen3"))
    state = make_state(parse_config(["--model", model, "--data-dir", str(tmp_path), *flags]))
    try:
        assert state.provider.arrivals.window == window
        assert state.provider.default.engine.arrivals is state.provider.arrivals
    finally:
        state.provider.close()


@pytest.mark.parametrize("value", ["-1", "nan", "11", "soon"])
def test_join_window_must_be_seconds_between_0_and_10(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--join-window", value])
    assert "--join-window" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,order",
    [([], "pipelined"), (["--step-order", "pipelined"], "pipelined"),
     (["--step-order", "thread"], "thread")],
)  # fmt: skip
def test_step_order_reaches_the_engine(flags, order, tiny_model, tmp_path, monkeypatch):
    """--step-order (else the machine's: pipelined on this CPU, thread on CUDA) is the
    engine's batched step order, with MLXD_THREAD_ROWS's floor."""
    import mlx.core as mx

    if not flags and mx.cuda.is_available():
        order = "thread"
    from mlxd.serve.main import make_state

    monkeypatch.setenv("MLXD_THREAD_ROWS", "4")
    model = str(tiny_model("qwen3"))
    state = make_state(parse_config(["--model", model, "--data-dir", str(tmp_path), *flags]))
    try:
        config = state.provider.default.engine.config
        assert (config.step_order, config.thread_rows) == (order, 4)
    finally:
        state.provider.close()


@pytest.mark.parametrize(
    "env",
    [("MLXD_THREAD_ROWS", "0"), ("MLXD_THREAD_ROWS", "many"), ("MLXD_KERNELS_AT", "32 60")],
)
def test_a_bad_engine_environment_stops_serve_with_one_line(env, monkeypatch) -> None:
    import mlxd.serve.main as serve_main
    from mlxd.cli import serve as serve_cli

    monkeypatch.setenv(*env)
    monkeypatch.setattr(serve_main, "serve", lambda a, **_: pytest.fail("served"))
    with pytest.raises(
        SystemExit, match=f"mlxd serve: error: {env[0]}.*(a whole number|a row count|three int)"
    ):
        serve_cli.run(build_parser().parse_args(["serve", "--switch-interval", "engine"]))


@pytest.mark.parametrize("order", ["later", "wait", "split"])
def test_step_order_flag_takes_only_the_two_orders(order: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--step-order", order])
    assert "--step-order" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,budget",
    [([], 8 * 2048), (["--prefill-batch-tokens", "0"], None),
     (["--prefill-batch-tokens", "5000"], 5000),
     (["--prompt-concurrency", "4", "--prefill-step-size", "512"], 4 * 512)],
)  # fmt: skip
def test_prefill_waves_default_to_mlx_lms_largest_wave(flags: list[str], budget) -> None:
    engine = parse_config(flags).resolved().engine
    assert engine.prefill_tokens == budget


@pytest.mark.parametrize("value", ["150%", "0%", "lots", "12XB"])
def test_memory_budget_must_be_a_size_or_a_percentage(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--memory-budget", value])
    assert "--memory-budget" in capsys.readouterr().err


def test_prefill_batch_tokens_refuses_a_negative_count() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--prefill-batch-tokens", "-5"])
