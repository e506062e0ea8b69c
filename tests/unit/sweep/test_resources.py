"""Trial resources as RLlib requests them, the feasibility check, and --fit-to-machine's plan."""

from __future__ import annotations

import os
import re

import pytest

from rllib_amp import experiment as E
from rllib_amp.sweep import resources as R

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PONG = os.path.join(ROOT, "tune_configs", "pong_ppo_amp.yaml")
LAPTOP = {"CPU": 2.0, "GPU": 0.0}


def _rllib_total(exp) -> dict[str, float]:
    config = exp.algorithm_config()
    pgf = config.algo_class.default_resource_request(config.to_dict())
    return {k: float(pgf.required_resources.get(k, 0.0)) for k in ("CPU", "GPU")}


def test_request_is_rllibs_placement_group():
    exp = E.load(PONG)
    request = R.trial_request(exp.algorithm_config())
    assert request.total == _rllib_total(exp)
    # trial process + 8 env runners + 1 GPU learner, in RLlib's bundle order
    assert request.total == {"CPU": 9.0, "GPU": 1.0}
    assert request.describe() == (
        "1 CPU for the trial process, 8 env runners x 1 CPU, 1 learner x 1 GPU"
    )


def test_pong_is_scaled_down_to_a_two_core_machine_without_gpu():
    exp = E.load(PONG)
    over = R.fit_overrides(exp, LAPTOP)
    assert over == {
        "resources.num_gpus_per_learner": 0,
        "resources.num_learners": 0,
        "resources.num_env_runners": 1,
    }
    fitted = exp.with_overrides(over)
    assert _rllib_total(fitted) == {"CPU": 2.0, "GPU": 0.0}
    R.check_fits(fitted, LAPTOP)  # no error
    # Everything else about the experiment is as written.
    assert fitted.get("training") == exp.get("training")
    assert fitted.get("resources.num_envs_per_env_runner") == 4


def test_a_gpu_machine_keeps_the_gpu_learner_and_drops_env_runners():
    exp = E.load(PONG)
    over = R.fit_overrides(exp, {"CPU": 4.0, "GPU": 1.0})
    assert over == {"resources.num_env_runners": 3}
    assert _rllib_total(exp.with_overrides(over)) == {"CPU": 4.0, "GPU": 1.0}
    assert R.fit_overrides(exp, {"CPU": 16.0, "GPU": 1.0}) == {}


def test_infeasible_trial_error_has_the_numbers_and_overrides_that_really_fit():
    exp = E.load(PONG)
    with pytest.raises(R.ResourceError) as e:
        R.check_fits(exp, LAPTOP)
    msg = str(e.value)
    assert "\n" not in msg
    assert "needs 9 CPUs and 1 GPU" in msg and "has 2 CPUs and 0 GPUs" in msg
    assert "--fit-to-machine" in msg
    suggested = re.findall(r"--set (\S+)=(\S+)", msg)
    assert suggested
    R.check_fits(exp.with_overrides([f"{k}={v}" for k, v in suggested]), LAPTOP)


def _cartpole(tmp_path, extra: str):
    path = tmp_path / "e.yaml"
    path.write_text(f"algorithm: PPO\nenv: CartPole-v1\nstop: {{training_iteration: 1}}\n{extra}\n")
    return E.load(str(path))


def test_searched_resource_values_that_do_not_fit_name_the_search_key(tmp_path):
    exp = _cartpole(tmp_path, "search: {resources.num_env_runners: {grid: [0, 6]}}")
    with pytest.raises(R.ResourceError) as e:
        R.check_fits(exp, LAPTOP)
    assert "with search.resources.num_env_runners=6" in str(e.value)
    assert "narrow the values of search.resources.num_env_runners" in str(e.value)
    with pytest.raises(R.ResourceError, match=r"^--fit-to-machine: search.resources"):
        R.fit_overrides(exp, LAPTOP)
    assert R.fit_overrides(exp, {"CPU": 8.0}) == {}


def test_what_cannot_fit_even_scaled_down_says_so(tmp_path):
    exp = _cartpole(tmp_path, "resources: {num_cpus_per_env_runner: 0.5, num_env_runners: 2}")
    with pytest.raises(R.ResourceError, match="even scaled down"):
        R.fit_overrides(exp, {"CPU": 0.5})


def test_local_capacity_is_what_a_local_ray_gets():
    capacity = R.local_capacity()
    assert capacity is not None and capacity["CPU"] >= 1
    assert set(capacity) == {"CPU", "GPU"}
