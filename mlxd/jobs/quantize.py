"""The quantization job's driver: mlx-lm's convert (load lazily, cast, quantize_model, save)
with our own loop around the evaluation, so each layer reports progress and a stop ends the job
between layers. The model is written to out/.partial and renamed to out/model only when
complete; a failed or stopped job leaves no model folder."""

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from .quantize_load import load_for_quantize
from .quantize_plan import plan_predicate
from .quantize_spec import QuantizeSpec
from .report import JobError, Reporter

PARTIAL = ".partial"
MODEL = "model"
MARKER = "mlxd_quantize.json"  # what the folder was made from, written before the rename
SENSITIVITY_SHARE = 0.7  # target_bpw runs: the progress the sensitivity stage takes


def _units(params: list[tuple[str, Any]]) -> list[list[Any]]:
    """The model's arrays grouped by layer (`...layers.N`), else by their module, in order."""
    groups: dict[str, list[Any]] = {}
    for key, value in params:
        parts = key.split(".")
        cut = next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
        groups.setdefault(".".join(parts[: max(cut, 1)]), []).append(value)
    return list(groups.values())


def _evaluate(model: Any, report: Reporter, start: float, end: float) -> None:
    """Compute the quantized weights one layer at a time (the same graph save would evaluate,
    so the same bits), reporting each and stopping between layers when asked."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    units = _units(tree_flatten(model.parameters()))
    for i, arrays in enumerate(units):
        if report.stop_requested():
            raise JobError("cancelled", "stopped")
        mx.eval(*arrays)
        report.progress(start + (end - start) * (i + 1) / len(units), "quantize")


def _marker(spec: QuantizeSpec, bpw: float) -> dict[str, Any]:
    return {
        "source": spec.model,
        "mode": spec.mode,
        "bits": spec.bits,
        "group_size": spec.group_size,
        "recipe": spec.recipe,
        "target_bpw": spec.target_bpw,
        "bits_per_weight": bpw,
    }


def run_quantize(spec: QuantizeSpec, out: Path, report: Reporter) -> dict:
    """Quantize spec.model into out/model; the result names it and its bits per weight."""
    out = Path(out)
    partial, final = out / PARTIAL, out / MODEL
    if final.exists():
        raise JobError("exists", f"{final} exists already")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        return _run(spec, out, partial, final, report)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _run(spec: QuantizeSpec, out: Path, partial: Path, final: Path, report: Reporter) -> dict:
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import compute_bits_per_weight, quantize_model, save

    bits, start, predicate = spec.bits, 0.0, None
    planned: dict[str, int] | None = None
    if spec.target_bpw is not None:
        from .quantize_target import plan_target

        planned = plan_target(spec, out, report, SENSITIVITY_SHARE)
        bits, start = spec.candidate_bits[0], SENSITIVITY_SHARE
    report.progress(start, "load")
    model, tokenizer, config = load_for_quantize(spec.model, spec.dtype)
    if spec.recipe is not None:
        predicate = mixed_quant_predicate_builder(spec.recipe, model, spec.group_size)
    elif planned is not None:
        predicate = plan_predicate(model, planned, spec.group_size, bits)
    # quantize_model and save print progress lines: stdout is the CLI's answer, keep it clean.
    with contextlib.redirect_stdout(sys.stderr):
        model, config = quantize_model(
            model, config, spec.group_size, bits, mode=spec.mode, quant_predicate=predicate
        )
    bpw = compute_bits_per_weight(model)
    if spec.target_bpw is not None and bpw > spec.target_bpw:
        raise JobError("internal", f"planned {bpw:.4f} bits per weight, above the target")
    _evaluate(model, report, start, start + (1 - start) * 0.9)
    report.progress(start + (1 - start) * 0.9, "save")
    with contextlib.redirect_stdout(sys.stderr):
        save(partial, spec.model, model, tokenizer, config)
    if report.stop_requested():
        raise JobError("cancelled", "stopped")
    (partial / MARKER).write_text(json.dumps(_marker(spec, bpw), indent=2) + "\n")
    partial.rename(final)
    report.progress(1.0, "done")
    result = {
        "model_path": str(final),
        "bits_per_weight": bpw,
        "mode": spec.mode,
        "bits": bits,
        "group_size": spec.group_size,
    }
    if planned is not None:
        result["layer_bits"] = planned
    return result
