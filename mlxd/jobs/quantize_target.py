"""The target_bpw stage of a quantization job: measure each layer's sensitivity on calibration
text, then plan per-layer widths within the target (progress 0 .. `until`)."""

import contextlib
import json
import sys
from pathlib import Path

from .calibration import calibration_tokens
from .quantize_load import load_for_quantize
from .quantize_plan import choose_bits, model_bytes, plan_predicate
from .quantize_spec import QuantizeSpec
from .report import JobError, Reporter
from .sensitivity import measure, quantizable


def plan_target(spec: QuantizeSpec, out: Path, report: Reporter, until: float) -> dict[str, int]:
    """{layer path: width} for spec.target_bpw; the measurements go to out/sensitivity.json."""
    import mlx.core as mx
    from mlx_lm.utils import get_total_parameters, quantize_model

    assert spec.target_bpw is not None
    widths = spec.candidate_bits
    model, tokenizer, config = load_for_quantize(spec.model, spec.dtype)
    mx.eval(model.parameters())
    model.eval()
    try:
        tokens = calibration_tokens(tokenizer, spec.calibration, spec.calibration_tokens)
    except (OSError, ValueError) as e:
        raise JobError("invalid_calibration", f"calibration: {e}") from e
    report.message(f"measuring sensitivity on {tokens.shape[1]} calibration tokens")

    def step(done: int, total: int) -> None:
        report.progress(until * done / total, "sensitivity")
        if report.stop_requested():
            raise JobError("cancelled", "stopped")

    # The widest candidate is the reference each step moves towards: it is not measured.
    kl = measure(model, tokens, spec.group_size, widths[:-1], step)
    sizes = {path: module.weight.size for path, module in quantizable(model, spec.group_size)}
    # The model's bytes with every layer at the lowest width, counted on a lazy quantization
    # (array sizes need no evaluation).
    low = plan_predicate(model, {}, spec.group_size, widths[0])
    with contextlib.redirect_stdout(sys.stderr):
        model, _ = quantize_model(model, config, spec.group_size, widths[0], quant_predicate=low)
    base, params = model_bytes(model), get_total_parameters(model)
    del model
    try:
        bits = choose_bits(kl, sizes, widths, base, params, spec.target_bpw)
    except ValueError as e:
        raise JobError("unreachable_target", str(e)) from e
    table = {p: {"kl": {str(b): v for b, v in kl[p].items()}, "bits": bits[p]} for p in kl}
    (out / "sensitivity.json").write_text(json.dumps(table, indent=1) + "\n")
    high = sum(1 for b in bits.values() if b > widths[0])
    report.message(f"planned {high} of {len(bits)} layers above {widths[0]} bits")
    return bits
