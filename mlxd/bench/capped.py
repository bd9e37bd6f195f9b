"""`python -m mlxd.bench.capped BYTES MODULE ARGS...`: run `python -m MODULE ARGS...` with MLX's
buffer cache capped at BYTES (`mx.set_cache_limit`), for `mlxd bench serve --cache-limit-gb`.

An MLX process keeps the buffers it frees for reuse until its own active plus cached memory
reaches 95% of the device's (MLX-CUDA's allocator.cpp), so two servers on one GPU starve each
other. Both sides get the same cap: neither server is changed, only the process they run in.
"""

import runpy
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m mlxd.bench.capped BYTES MODULE [ARGS...]")
    import mlx.core as mx

    mx.set_cache_limit(int(argv[0]))
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
