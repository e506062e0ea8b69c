"""tune.scheduler: pbt: the schema, and the scheduler Tune gets (no Ray started)."""

from __future__ import annotations

import pytest

from rllib_amp import experiment as E
from rllib_amp.experiment.pbt import check_pbt_mutations
from rllib_amp.sweep import schedulers
from rllib_amp.sweep.summary import config_path

BASE = {
    "algorithm": "PPO",
    "env": "CartPole-v1",
    "amp": {"dtype": "float16"},
    "training": {"train_batch_size_per_learner": 500, "minibatch_size": 250},
    "stop": {"training_iteration": 6},
    "checkpoint": {"frequency": 2},
}
MUTATIONS = {
    "training.lr": {"loguniform": [1e-4, 1e-3]},
    "training.train_batch_size_per_learner": [250, 500, 1000],
    "training.entropy_coeff": {"uniform": [0.0, 0.01]},
    "amp.growth_interval": [10, 100, 2000],
    "amp.growth_factor": [1.5, 2.0],
    "amp.backoff_factor": {"uniform": [0.25, 0.75]},
}


def pbt(mutations=None, **extra):
    tune = {
        "scheduler": "pbt",
        "pbt": {"perturbation_interval": 2, "hyperparam_mutations": mutations or MUTATIONS},
    }
    tune["pbt"].update(extra.pop("pbt", {}))
    return {**BASE, "tune": tune, **extra}


def test_pbt_section_is_normalised_and_maps_to_trial_config_paths():
    exp = E.Experiment(E.validate(pbt()))
    assert exp.tune["pbt"]["hyperparam_mutations"]["amp.growth_interval"] == {
        "choice": [10, 100, 2000]
    }
    sched = schedulers.scheduler(exp, config_path)
    assert sched._time_attr == "training_iteration"
    assert sched.set_search_properties(exp.tune["metric"], exp.tune["mode"])  # as Tune does
    assert (sched._metric, sched._mode) == ("env_runners/episode_return_mean", "max")
    m = sched._hyperparam_mutations
    assert m["_train_batch_size_per_learner"] == [250, 500, 1000]
    assert set(m) == {"lr", "_train_batch_size_per_learner", "entropy_coeff", "learner_config_dict"}
    amp = m["learner_config_dict"]["rllib_amp"]
    assert amp["growth_interval"] == [10, 100, 2000] and amp["growth_factor"] == [1.5, 2.0]
    # Every mapped path exists in a trial's config: PBT perturbs what is there.
    sample = schedulers.param_space(exp).to_dict()
    assert sample["learner_config_dict"]["rllib_amp"]["growth_interval"] is not None
    for key in ("lr", "_train_batch_size_per_learner", "entropy_coeff"):
        assert key in sample


def test_a_perturbed_range_value_stays_in_the_range():
    exp = E.Experiment(E.validate(pbt()))
    clip = schedulers.scheduler(exp, config_path)._custom_explore_fn
    cfg = {"lr": 2e-3, "entropy_coeff": -1.0, "learner_config_dict": {"rllib_amp": {}}}
    cfg["learner_config_dict"]["rllib_amp"]["backoff_factor"] = 0.9
    out = clip(cfg)
    assert out["lr"] == 1e-3 and out["entropy_coeff"] == 0.0
    assert out["learner_config_dict"]["rllib_amp"]["backoff_factor"] == 0.75


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (pbt({"amp.init_scale": [1024.0, 65536.0]}), "amp.init_scale: cannot change under PBT"),
        (pbt({"amp.warm_start": [None]}), "amp.warm_start: cannot change under PBT"),
        (
            {**pbt(), "search": {"amp.init_scale": {"grid": [1024.0, 65536.0]}}},
            "search.amp.init_scale: cannot change under PBT",
        ),
        (pbt(pbt={"perturbation_intervall": 2}), "did you mean 'perturbation_interval'"),
        ({**BASE, "tune": {"scheduler": "pbtt"}}, "did you mean 'pbt'"),
        ({**BASE, "tune": {"scheduler": "pbt"}}, "tune.pbt: missing"),
        ({**BASE, "tune": {"pbt": {"perturbation_interval": 2}}}, "add 'scheduler: pbt'"),
        (pbt({"amp.backoff_factor": [0.5, 2.0]}), "amp.backoff_factor: got 2.0"),
        (pbt({"training.lr": {"grid": [1e-4]}}), "grid multiplies trials"),
        (pbt({"model.fcnet_hiddens": [[8]]}), "PBT mutates one key of amp or training"),
        (
            pbt({"training.train_batch_size_per_learner": {"uniform": [100, 900]}}),
            "takes an integer",
        ),
        (pbt({"training.train_batch_size_per_learner": [100, 500]}), "minibatch_size"),
        ({**pbt(), "checkpoint": {"frequency": 3}}, "set checkpoint.frequency to 1..2"),
        ({**pbt(), "checkpoint": {"frequency": 0}}, "checkpoint.frequency"),
    ],
)
def test_bad_pbt_input_names_the_key_and_the_fix(raw, fragment):
    with pytest.raises(E.ExperimentError) as e:
        E.validate(raw, "f.yaml")
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_shipped_pbt_file_is_valid():
    exp = E.load("tune_configs/cartpole_ppo_pbt.yaml")
    assert exp.tune["scheduler"] == "pbt"


# -- the AMP keys PBT may not mutate (experiment.pbt) ---------------------------------------------
def test_pbt_may_mutate_the_scaler_factors_and_interval():
    check_pbt_mutations(
        {
            "amp.growth_interval": [100, 2000],
            "amp": {"growth_factor": [2.0, 4.0], "backoff_factor": [0.5]},
            "training.lr": [1e-4, 3e-4],
        },
        searched=["amp.growth_interval", "training.train_batch_size_per_learner"],
    )


@pytest.mark.parametrize(
    "mutations, searched, where",
    [
        ({"amp.init_scale": [1024.0, 65536.0]}, (), "hyperparam_mutations.amp.init_scale"),
        ({"amp": {"init_scale": [1024.0]}}, (), "hyperparam_mutations.amp.init_scale"),
        (
            {"learner_config_dict": {"rllib_amp": {"init_scale": [2.0]}}},
            (),
            "hyperparam_mutations.learner_config_dict.rllib_amp.init_scale",
        ),
        ({"init_scale": [2.0]}, (), "hyperparam_mutations.init_scale"),
        ({}, ["amp.init_scale"], "search.amp.init_scale"),
        ({"amp.warm_start": [{"from": "/a"}]}, (), "hyperparam_mutations.amp.warm_start"),
    ],
)
def test_pbt_refuses_init_scale_and_warm_start_naming_key_and_fix(mutations, searched, where):
    with pytest.raises(ValueError) as e:
        check_pbt_mutations(mutations, searched=searched)
    msg = str(e.value)
    assert msg.startswith(f"{where}: cannot change under PBT"), msg
    fix = "growth_interval" if "init_scale" in where else "outside search and hyperparam_mutations"
    assert fix in msg, msg


def test_pbt_check_ignores_keys_of_other_sections_that_share_a_name():
    check_pbt_mutations({"env_config.init_scale": [1, 2], "model": {"warm_start": [True]}})
