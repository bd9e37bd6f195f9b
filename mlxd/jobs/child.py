"""The job process: `python -m mlxd.jobs.child`. Its first stdin line is the job as JSON
({"type", "spec", "out", "memory_limit"}); later lines are commands ("stop"); stdin's EOF means
the server is gone, and the job ends with it. Events go out as JSON lines on the stdout it was
started with; anything else printed (mlx-lm's progress bars) goes to stderr, the job's log."""

import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from .report import JobError, Reporter


def _driver(kind: str) -> tuple[Any, Any]:
    """The kind's spec class and driver function, imported only in the job process."""
    if kind == "fine_tune":
        from .finetune import FineTuneSpec, run_finetune

        return FineTuneSpec, run_finetune
    if kind == "quantize":
        from .quantize import QuantizeSpec, run_quantize

        return QuantizeSpec, run_quantize
    raise JobError("invalid_job", f"no job type {kind!r}")


def _listen(stop: threading.Event) -> None:
    """Commands from the server; EOF (the server exited or was killed) ends the job now."""
    for line in sys.stdin:
        if line.strip() == "stop":
            stop.set()
    os._exit(3)


def main() -> int:
    events = os.fdopen(os.dup(1), "w", buffering=1)  # the server reads events from here
    os.dup2(2, 1)  # prints from the work itself land in the job's log
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            events.write(json.dumps(event, default=str) + "\n")

    job = json.loads(sys.stdin.readline() or "null")
    if not isinstance(job, dict):
        return 2
    stop = threading.Event()
    threading.Thread(target=_listen, args=(stop,), name="mlxd-job-stdin", daemon=True).start()
    if job.get("nice"):
        os.nice(int(job["nice"]))  # a background job yields the CPU to serving
    try:
        if job.get("memory_limit"):
            import mlx.core as mx

            mx.set_memory_limit(int(job["memory_limit"]))  # the lease the pool granted
        spec_class, run = _driver(job["type"])
        result = run(spec_class.from_dict(job["spec"]), Path(job["out"]), Reporter(emit, stop))
        emit({"type": "result", "result": result})
        return 0
    except JobError as e:
        emit({"type": "error", "code": e.code, "message": e.message})
    except ValueError as e:
        emit({"type": "error", "code": "invalid_spec", "message": str(e)})
    except Exception as e:  # noqa: BLE001 - the job fails with its reason, the server lives on
        traceback.print_exc()
        emit({"type": "error", "code": "internal", "message": f"{type(e).__name__}: {e}"})
    return 1


if __name__ == "__main__":
    sys.exit(main())
