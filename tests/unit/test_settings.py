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


# -- warm_start and shared_scaler ---------------------------------------------------------------
def test_new_fields_default_off():
    s = AmpSettings()
    assert (s.warm_start, s.shared_scaler) == (None, False)


def test_warm_start_is_parsed_made_absolute_and_round_trips(tmp_path, monkeypatch):
    from rllib_amp.settings import WarmStart

    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    s = AmpSettings.from_dict({"warm_start": {"from": "ckpt", "modules": {"p1": "p0"}}})
    assert s.warm_start == WarmStart(path=str(tmp_path / "ckpt"), modules=(("p1", "p0"),))
    assert s.warm_start.module_map(["p1", "p2"]) == {"p1": "p0"}
    assert s.to_dict()["warm_start"] == {"from": str(tmp_path / "ckpt"), "modules": {"p1": "p0"}}
    assert AmpSettings.from_dict(s.to_dict()) == s
    assert hash(s) == hash(AmpSettings.from_dict(s.to_dict()))
    same_ids = AmpSettings(warm_start={"from": tmp_path / "ckpt"}).warm_start
    assert same_ids.module_map(["a", "b"]) == {"a": "a", "b": "b"}
    # A URI is read where the learner runs: not checked here.
    uri = AmpSettings(warm_start={"from": "s3://bucket/run/checkpoint_000001"})
    assert uri.warm_start.path == "s3://bucket/run/checkpoint_000001"


@pytest.mark.parametrize(
    "warm_start, key, fragment",
    [
        ({"from": "/no/such/checkpoint"}, "amp.warm_start.from", "does not exist"),
        ({"from": ""}, "amp.warm_start.from", "path or URI"),
        ({"modules": {"p1": "p0"}}, "amp.warm_start.from", "missing"),
        ({"from": "/", "module": {"p1": "p0"}}, "amp.warm_start.module", "did you mean 'modules'"),
        ({"from": "/", "modules": {}}, "amp.warm_start.modules", "non-empty mapping"),
        ({"from": "/", "modules": ["p0"]}, "amp.warm_start.modules", "new_id: old_id"),
        ({"from": "/", "modules": {"p1": 3}}, "amp.warm_start.modules", "ModuleIDs"),
        ("/some/checkpoint", "amp.warm_start", "expected a mapping"),
    ],
)
def test_bad_warm_start_names_the_key_and_the_fix(warm_start, key, fragment):
    with pytest.raises(ValueError) as e:
        AmpSettings.from_dict({"warm_start": warm_start})
    msg = str(e.value)
    assert msg.startswith(f"{key}:"), msg
    assert fragment in msg, msg


def test_shared_scaler_must_be_a_bool():
    assert AmpSettings.from_dict({"shared_scaler": True}).shared_scaler is True
    with pytest.raises(ValueError, match=r"^amp\.shared_scaler: got 'yes'; allowed: true, false"):
        AmpSettings.from_dict({"shared_scaler": "yes"})


def test_with_amp_takes_warm_start_and_the_learner_reads_it_back(tmp_path):
    from ray.rllib.algorithms.ppo import PPOConfig

    from rllib_amp import with_amp
    from rllib_amp.settings import settings_from_config

    cfg = with_amp(PPOConfig(), warm_start={"from": str(tmp_path)}, shared_scaler=True)
    s = settings_from_config(cfg)
    assert s.warm_start.path == str(tmp_path) and s.shared_scaler is True
