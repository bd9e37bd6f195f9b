"""A bench JSON's failed rounds: the server's exit status and the head of its first traceback
(a native crash: faulthandler's stacks), so a device call's text output says why."""

import json
import sys


def main(path: str, lines: int = 60) -> None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"failed_rounds: {path}: {e}")
        return
    for side, data in doc.get("sides", {}).items():
        for n, runs in data.get("runs", {}).items():
            for r, run in enumerate(runs):
                if not run.get("figures", {}).get("errors"):
                    continue
                print(f"== {side} N={n} round {r}: server_exit {run.get('server_exit')}")
                dump = run.get("first_traceback") or "(no traceback)"
                print("\n".join(dump.splitlines()[:lines]))


if __name__ == "__main__":
    main(sys.argv[1])
