import dataclasses

import pytest

from rllib_amp import AmpSettings


def test_defaults_match_torch_gradscaler():
    s = AmpSettings()
    assert (s.enabled, s.dtype) == ("auto", "auto")
    assert (s.init_scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        65536.0,
        2.0,
        0.5,
        2000,
    )


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AmpSettings().init_scale = 1.0  # type: ignore[misc]


def test_from_dict_accepts_valid_and_normalises():
    s = AmpSettings.from_dict(
        {"enabled": None, "dtype": "bf16", "init_scale": 1024, "growth_interval": 10.0}
    )
    assert s.enabled == "auto"
    assert s.dtype == "bfloat16"
    assert s.init_scale == 1024.0 and isinstance(s.init_scale, float)
    assert s.growth_interval == 10 and isinstance(s.growth_interval, int)
    assert AmpSettings.from_dict(None) == AmpSettings()
    assert AmpSettings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    "d, key, fragment",
    [
        ({"init_scale": 0}, "init_scale", "> 0"),
        ({"init_scale": -5.0}, "init_scale", "> 0"),
        ({"init_scale": float("inf")}, "init_scale", "finite"),
        ({"init_scale": "big"}, "init_scale", "finite number"),
        ({"growth_factor": 1.0}, "growth_factor", "> 1"),
        ({"backoff_factor": 1.0}, "backoff_factor", "(0, 1)"),
        ({"backoff_factor": 0.0}, "backoff_factor", "(0, 1)"),
        ({"growth_interval": 0}, "growth_interval", "[1, 2147483647]"),
        ({"growth_interval": 2.5}, "growth_interval", "integer"),
        ({"growth_interval": True}, "growth_interval", "integer"),
        ({"dtype": "float8"}, "dtype", "float16"),
        ({"enabled": "yes"}, "enabled", "'auto'"),
    ],
)
def test_from_dict_rejects_invalid_values_naming_key_value_and_allowed(d, key, fragment):
    with pytest.raises(ValueError) as e:
        AmpSettings.from_dict(d)
    msg = str(e.value)
    assert msg.startswith(f"amp.{key}:"), msg
    assert repr(next(iter(d.values()))) in msg or "float8" in msg, msg
    assert fragment in msg, msg


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(
        ValueError, match=r"amp\.init_scal: unknown AMP setting \(did you mean 'init_scale'\?\)"
    ):
        AmpSettings.from_dict({"init_scal": 2.0})


def test_non_mapping_is_rejected():
    with pytest.raises(ValueError, match="expected a mapping"):
        AmpSettings.from_dict([1, 2])  # type: ignore[arg-type]


def test_direct_construction_is_validated_too():
    with pytest.raises(ValueError, match="growth_factor"):
        AmpSettings(growth_factor=0.5)


def test_replace_validates():
    s = AmpSettings().replace(init_scale=2.0)
    assert s.init_scale == 2.0
    with pytest.raises(ValueError, match="backoff_factor"):
        AmpSettings().replace(backoff_factor=2)


@pytest.mark.parametrize(
    "d, key, fragment",
    [
        ({"init_scale": 2**1024}, "init_scale", "(309 digits); must be within"),
        ({"init_scale": 1e-50}, "init_scale", "must be within [5.96046e-08"),
        ({"init_scale": 1e39}, "init_scale", "3.40282e+38"),
        ({"growth_interval": 2**63}, "growth_interval", "int32"),
        ({"growth_factor": 2**2000}, "growth_factor", "digits); must be <= 65536"),
        ({"skip_warning_updates": 2**40}, "skip_warning_updates", "2147483647"),
    ],
)
def test_values_beyond_what_the_scaler_can_hold_are_rejected(d, key, fragment):
    with pytest.raises(ValueError) as e:
        AmpSettings.from_dict(d)
    msg = str(e.value)
    assert msg.startswith(f"amp.{key}: got "), msg
    assert fragment in msg, msg
    assert len(msg) < 300, "a huge value is shown by its size, not its digits"


def test_numpy_scalars_and_dtype_spellings_are_accepted_as_in_yaml():
    np = pytest.importorskip("numpy")
    s = AmpSettings(
        enabled=np.bool_(True),
        dtype="BF16",
        init_scale=np.float32(1024),
        growth_factor=np.float64(2.0),
        growth_interval=np.int64(5),
        inference_dtype="fp32",
        tune_cpu_malloc=np.bool_(False),
    )
    assert s == AmpSettings.from_dict(
        {
            "enabled": True,
            "dtype": "bfloat16",
            "init_scale": 1024,
            "growth_interval": 5,
            "inference_dtype": "float32",
            "tune_cpu_malloc": False,
        }
    )
    assert type(s.init_scale) is float and type(s.growth_interval) is int
    assert type(s.enabled) is bool and type(s.tune_cpu_malloc) is bool
    assert AmpSettings(dtype="half").dtype == AmpSettings(dtype="fp16").dtype == "float16"
