"""QuantizeSpec.from_dict: mlx-lm's defaults per mode, and a one-line ValueError naming the
field for every bad request (the server's 400)."""

import pytest

from mlxd.jobs.quantize_spec import QuantizeSpec


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def test_defaults(model):
    spec = QuantizeSpec.from_dict({"model": model})
    assert (spec.mode, spec.bits, spec.group_size, spec.recipe, spec.dtype) == (
        "affine",
        4,
        64,
        None,
        None,
    )
    assert spec.target_bpw is None and spec.calibration is None


@pytest.mark.parametrize(
    ("mode", "group_size", "bits"), [("mxfp4", 32, 4), ("nvfp4", 16, 4), ("mxfp8", 32, 8)]
)
def test_fp_modes_take_mlx_lm_sizes(model, mode, group_size, bits):
    spec = QuantizeSpec.from_dict({"model": model, "mode": mode})
    assert (spec.group_size, spec.bits) == (group_size, bits)


def test_target_candidates(model, tmp_path):
    text = tmp_path / "cal.txt"
    text.write_text("some text")
    spec = QuantizeSpec.from_dict(
        {"model": model, "target_bpw": 5, "high_bits": 6, "calibration": str(text)}
    )
    assert (spec.target_bpw, spec.candidate_bits, spec.calibration) == (5.0, (4, 6), str(text))
    spec = QuantizeSpec.from_dict({"model": model, "target_bpw": 3.5, "candidate_bits": [8, 2, 4]})
    assert spec.candidate_bits == (2, 4, 8)


BAD = [
    ({}, "model"),
    ({"model": "/nonexistent/folder"}, "model"),
    ({"colour": "red"}, "colour"),
    ({"mode": "int4"}, "mode"),
    ({"bits": 1}, "bits"),
    ({"bits": 9}, "bits"),
    ({"bits": "4"}, "bits"),
    ({"bits": True}, "bits"),
    ({"group_size": 48}, "group_size"),
    ({"mode": "mxfp4", "bits": 8}, "bits"),
    ({"mode": "nvfp4", "group_size": 32}, "group_size"),
    ({"recipe": "mixed_5_7"}, "recipe"),
    ({"recipe": "mixed_3_6", "mode": "mxfp4"}, "recipe"),
    ({"target_bpw": 5.0, "recipe": "mixed_3_6"}, "target_bpw"),
    ({"target_bpw": 5.0, "mode": "mxfp8"}, "target_bpw"),
    ({"target_bpw": "5"}, "target_bpw"),
    ({"target_bpw": 0.5}, "target_bpw"),
    ({"low_bits": 3}, "candidate_bits"),
    ({"target_bpw": 5.0, "candidate_bits": [4]}, "candidate_bits"),
    ({"target_bpw": 5.0, "candidate_bits": [4, 4]}, "candidate_bits"),
    ({"target_bpw": 5.0, "candidate_bits": [4, 9]}, "candidate_bits"),
    ({"target_bpw": 5.0, "candidate_bits": [4, 8], "low_bits": 2}, "candidate_bits"),
    ({"target_bpw": 5.0, "calibration": "/nonexistent.txt"}, "calibration"),
    ({"target_bpw": 5.0, "calibration_tokens": 2}, "calibration_tokens"),
    ({"dtype": "float64"}, "dtype"),
    ({"name": "../escape"}, "name"),
    ({"name": ""}, "name"),
]


@pytest.mark.parametrize(("fields", "field"), BAD, ids=[str(f) for f, _ in BAD])
def test_rejections_name_the_field(model, fields, field):
    d = {"model": model, **fields}
    if "model" in fields or not fields:
        d = fields
    with pytest.raises(ValueError) as e:
        QuantizeSpec.from_dict(d)
    assert str(e.value).startswith(f"{field}:")
    assert "\n" not in str(e.value)


def test_spec_is_frozen(model):
    spec = QuantizeSpec.from_dict({"model": model})
    with pytest.raises(AttributeError):
        spec.bits = 8  # type: ignore[misc]
