"""A server that dies of a native crash: `mlxd serve` has faulthandler print every thread's
stack, and the bench's record of the failed round carries that dump and the exit status
(a fleet once lost its 32 streams to a crash that left no trace in the log)."""

import signal
import sys
from pathlib import Path

from mlxd.bench.servers import Server, first_traceback, free_port

# `mlxd serve`'s own start-up (cli/serve.py's run), its server swapped for a crash in one
# thread while another waits: the stand-in for MLX failing under the engine's threads.
CRASHING_SERVE = """
import ctypes, sys, threading, time
import mlxd.serve.main
from mlxd.cli import build_parser
from mlxd.cli import serve as cli_serve

def crash(args, **_):
    def engine_loop():
        time.sleep(30)
    threading.Thread(target=engine_loop, daemon=True).start()
    time.sleep(0.2)
    print("INFO:     ready", flush=True)
    ctypes.string_at(0)  # a segmentation fault, as a native library's

mlxd.serve.main.serve = crash
cli_serve.run(build_parser().parse_args(["serve", "--model", sys.argv[1]]))
"""


def test_a_native_crash_leaves_every_threads_stack_and_its_signal(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SERVE)
    srv = Server("mlxd", [sys.executable, str(script), str(tmp_path)], free_port(), tmp_path)
    srv.start()
    assert srv.proc is not None
    srv.proc.wait(timeout=120)
    assert srv.exit_code() == -signal.SIGSEGV
    dump = srv.first_traceback()
    assert dump.startswith("Fatal Python error: Segmentation fault")
    assert "in engine_loop" in dump and "in crash" in dump  # both threads' stacks
    assert "INFO:     ready" not in dump


def test_the_fatal_dump_ends_after_the_last_threads_stack() -> None:
    log = "\n".join([
        "INFO: ok",
        "Fatal Python error: Aborted",
        "",
        "Thread 0x1 (most recent call first):",
        '  File "encoder.py", line 103 in _run',
        "",
        "Current thread 0x2 (most recent call first):",
        '  File "turns.py", line 72 in _turn',
        "",
        "Extension modules: mlx.core (total: 1)",
    ])  # fmt: skip
    assert first_traceback(log).splitlines()[-1] == '  File "turns.py", line 72 in _turn'
    assert first_traceback(log).count("most recent call first") == 2


def test_serve_starts_where_stderr_has_no_file(monkeypatch, tmp_path: Path) -> None:
    """An embedding whose stderr is not a file (an IDE's console): faulthandler cannot write
    there, and the server starts anyway."""
    import io

    import mlxd.serve.main
    from mlxd.cli import build_parser
    from mlxd.cli import serve as cli_serve

    started = []
    monkeypatch.setattr(mlxd.serve.main, "serve", lambda config, **_: started.append(config))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    cli_serve.run(build_parser().parse_args(["serve", "--model", str(tmp_path)]))
    assert len(started) == 1


def test_a_logged_failure_and_a_later_crash_both_come_back() -> None:
    """A step failure the server logged, then a native crash: the record keeps the first
    traceback (a cause) and the crash's dump (the death)."""
    log = "\n".join([
        "Traceback (most recent call last):",
        '  File "turns.py", line 9, in _batch_turn',
        "RuntimeError: [cuda] out of memory",
        "INFO: still serving",
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x2 (most recent call first):",
        '  File "encoder.py", line 103 in _run',
    ])  # fmt: skip
    got = first_traceback(log).split("\n\n")
    assert got[0].endswith("RuntimeError: [cuda] out of memory")
    assert got[1].startswith("Fatal Python error") and got[-1].endswith("in _run")
