"""The quantization driver writes what mlx-lm's convert writes: for every mode and recipe, the
same tensor names, every tensor bit-equal (mx.array_equal) and the same config quantization
section; and a stopped job leaves neither a model folder nor a partial one."""

import contextlib
import io
import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import convert

from mlxd.jobs.quantize import run_quantize
from mlxd.jobs.quantize_spec import QuantizeSpec
from mlxd.jobs.report import Collected, JobError, Reporter


def tensors(folder: Path) -> dict[str, mx.array]:
    found: dict[str, mx.array] = {}
    for f in sorted(folder.glob("*.safetensors")):
        found.update(mx.load(str(f)))
    return found


def convert_reference(src: Path, dest: Path, **kw) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(dest), quantize=True, **kw)
    return dest


def assert_same_model(mine: Path, ref: Path) -> None:
    a, b = tensors(mine), tensors(ref)
    assert a.keys() == b.keys()
    for k in b:
        assert a[k].dtype == b[k].dtype, k
        assert mx.array_equal(a[k], b[k]).item(), k
    ca = json.loads((mine / "config.json").read_text())
    cb = json.loads((ref / "config.json").read_text())
    assert ca["quantization"] == cb["quantization"]
    assert ca["quantization_config"] == cb["quantization_config"]


# (arch, spec fields, convert's arguments)
CASES = [
    ("qwen3", {}, dict(q_bits=4, q_group_size=64)),
    ("llama", {"bits": 8, "group_size": 32}, dict(q_bits=8, q_group_size=32)),
    ("qwen3", {"bits": 3, "dtype": "bfloat16"}, dict(q_bits=3, q_group_size=64, dtype="bfloat16")),
    ("qwen3", {"mode": "mxfp4"}, dict(q_mode="mxfp4")),
    ("qwen3", {"mode": "nvfp4"}, dict(q_mode="nvfp4")),
    ("qwen3", {"mode": "mxfp8"}, dict(q_mode="mxfp8")),
    (
        "gemma3",
        {"recipe": "mixed_2_6"},
        dict(q_bits=4, q_group_size=64, quant_predicate="mixed_2_6"),
    ),
    (
        "qwen3",
        {"recipe": "mixed_3_4"},
        dict(q_bits=4, q_group_size=64, quant_predicate="mixed_3_4"),
    ),
    (
        "gemma3",
        {"recipe": "mixed_3_6"},
        dict(q_bits=4, q_group_size=64, quant_predicate="mixed_3_6"),
    ),
    (
        "llama",
        {"recipe": "mixed_4_6"},
        dict(q_bits=4, q_group_size=64, quant_predicate="mixed_4_6"),
    ),
]


@pytest.mark.parametrize(("arch", "fields", "reference"), CASES, ids=lambda x: str(x))
def test_output_equals_mlx_lm_convert(tmp_path, tiny_model, arch, fields, reference):
    src = tiny_model(arch)
    report = Reporter.collect()
    result = run_quantize(QuantizeSpec.from_dict({"model": str(src), **fields}), tmp_path, report)
    ref = convert_reference(src, tmp_path / "ref", **reference)
    mine = Path(result["model_path"])
    assert mine == tmp_path / "model"
    assert_same_model(mine, ref)
    assert not (tmp_path / ".partial").exists()
    quant = json.loads((ref / "config.json").read_text())["quantization"]
    assert (result["mode"], result["bits"], result["group_size"]) == (
        quant.get("mode", "affine"),
        quant["bits"],
        quant["group_size"],
    )
    # Progress climbs to 1 layer by layer.
    fractions = [e["progress"] for e in report.events if e["type"] == "progress"]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 4


class StopAt(Collected):
    """Asks for a stop at the first progress event of `stage`."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def progress(self, fraction: float, stage: str = "", eta_s: float | None = None) -> None:
        super().progress(fraction, stage, eta_s)
        if stage == self.stage:
            self.stop()


@pytest.mark.parametrize(
    ("fields", "stage"),
    [({}, "quantize"), ({"target_bpw": 5.05, "calibration_tokens": 16}, "sensitivity")],
)
def test_stop_leaves_no_model(tmp_path, tiny_model, fields, stage):
    spec = QuantizeSpec.from_dict({"model": str(tiny_model("qwen3")), **fields})
    report = StopAt(stage)
    with pytest.raises(JobError) as e:
        run_quantize(spec, tmp_path, report)
    assert e.value.code == "cancelled"
    assert not (tmp_path / "model").exists()
    assert not (tmp_path / ".partial").exists()
    # It stopped at once: the last progress event is the one that asked.
    progress = [e for e in report.events if e["type"] == "progress"]
    assert progress[-1]["stage"] == stage and progress[-1]["progress"] < 1.0


def test_existing_model_is_refused(tmp_path, tiny_model):
    (tmp_path / "model").mkdir()
    spec = QuantizeSpec.from_dict({"model": str(tiny_model("qwen3"))})
    with pytest.raises(JobError) as e:
        run_quantize(spec, tmp_path, Reporter.collect())
    assert e.value.code == "exists"
