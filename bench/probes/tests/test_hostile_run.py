"""The hostile run end to end at a tiny size: a real `mlxd serve` subprocess on the tiny qwen3
model, a few dozen hostile requests (JSON bodies and raw malformed HTTP), and its summary."""

import json
from pathlib import Path

from bench.probes import hostile_run


def test_a_small_hostile_run(tiny_model, tmp_path: Path, capsys) -> None:
    out = tmp_path / "summary.json"
    argv = ["--requests", "40", "--burst", "8", "--concurrency", "4", "--deadline", "30",
            "--model", str(tiny_model("qwen3")), "--json", str(out)]  # fmt: skip
    code = hostile_run.main(argv)
    summary = json.loads(out.read_text())
    assert summary["requests"] == 40, summary
    assert sum(summary["by_status"].values()) == 40, summary  # every request has an outcome
    assert any(k.startswith("raw ") for k in summary["by_status"]), summary  # raw HTTP went out
    assert summary["5xx"] == 0 and summary["unanswered"] == 0, summary["cases"]
    assert summary["served_after"] == 200 and summary["rss_mb_after"] > 0
    assert code == 0 and '"wall_s"' in capsys.readouterr().out


def test_the_crash_the_fuzz_found(tiny_model, tmp_path: Path) -> None:
    """Found by the hostile run: two sampled rows (n=2) at a temperature of 1.8e308 with top_p
    killed the server (a segmentation fault in the batched decode step); now a 400."""
    import argparse

    import httpx

    a = argparse.Namespace(model=str(tiny_model("qwen3")), code=hostile_run.ROOT, serve_arg=[],
                           start_timeout=120, deadline=30, request_timeout=None)  # fmt: skip
    proc, url = hostile_run.start_server(a, str(tmp_path))
    try:
        body = {"prompt": [9707, 11, 1879], "temperature": 1.7976931348623157e308, "top_p": 0.9,
                "seed": 3, "n": 2, "max_tokens": 2}  # fmt: skip
        try:
            status = httpx.post(url + "/v1/completions", json=body, timeout=30).status_code
        except httpx.HTTPError as e:
            status = type(e).__name__
        assert status in (200, 400), status
        assert hostile_run._still_serves(url, 30) == 200
    finally:
        proc.kill()
        proc.wait(30)
