"""RLlib's ``torch_compile_learner`` with rllib-amp's learner: autocast and the scaler inside
a compiled update. The compiled AMP learner trains, routes an overflow to
the scaler (skip, back off once per step), and checkpoints its scaler state.

Compiled here is the whole update step (``COMPLETE_UPDATE``): RLlib 2.60's default,
``FORWARD_TRAIN``, compiles nothing for the modules a learner builds with (``TorchLearner.build``
tests ``isinstance(self._module, TorchRLModule)`` where it means each module), so it would
prove nothing.

Slow: inductor compiles C++ on a CPU. Measured on 2 shared cores (2026-12-01, load average
14-17): 131 s with inductor's caches off (the first compiled update), 35 s with its on-disk
cache warm.
"""

from __future__ import annotations

import copy

import pytest
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchCompileWhatToCompile

from rllib_amp import with_amp
from tests.integration.common import ppo_episodes

pytestmark = pytest.mark.slow
BATCH = 64


def _update(lrn, episodes):
    lrn.update(
        episodes=copy.deepcopy(episodes), timesteps={"num_env_steps_sampled_lifetime": BATCH}
    )


def _weights(lrn):
    module = lrn.module["default_policy"]
    return [p.detach().clone() for p in module.parameters()]


def _changed(a, b):
    return any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _compiled(what, **amp):
    cfg, episodes, spaces = ppo_episodes(BATCH)
    with_amp(cfg, **amp)
    cfg.framework(
        "torch",
        torch_compile_learner=True,
        torch_compile_learner_what_to_compile=what,
    )
    return cfg, episodes, spaces


def test_a_compiled_update_keeps_autocast_and_the_scaler_in_the_loop(tmp_path):
    init = 2.0**40  # float16 overflows: every step must be skipped and back the scale off
    cfg, episodes, spaces = _compiled(
        TorchCompileWhatToCompile.COMPLETE_UPDATE, dtype="float16", init_scale=init
    )
    lrn = cfg.build_learner(spaces=spaces)
    assert lrn._torch_compile_complete_update
    scaler = lrn.amp_scalers["default_policy"]
    before = _weights(lrn)
    for _ in range(3):  # RLlib runs its first update uncompiled, the others compiled
        _update(lrn, episodes)
    assert scaler.optimizer_steps_lifetime == 3
    assert scaler.skipped_steps_lifetime == 3
    assert scaler.get_scale() == init * 0.5**3
    assert not _changed(before, _weights(lrn)), "a skipped step changed the weights"

    scaler.seed(1024.0, 0)  # a scale float16 can carry: the compiled steps now step
    _update(lrn, episodes)
    _update(lrn, episodes)
    assert scaler.optimizer_steps_lifetime == 5 and scaler.skipped_steps_lifetime == 3
    after = _weights(lrn)
    assert _changed(before, after)
    assert all(bool(torch.isfinite(w).all()) for w in after)

    lrn.save_to_path(str(tmp_path))
    restored = cfg.build_learner(spaces=spaces)
    restored.restore_from_path(str(tmp_path))
    again = restored.amp_scalers["default_policy"]
    assert again.get_scale() == scaler.get_scale()
    assert again.growth_tracker == scaler.growth_tracker
    assert (again.optimizer_steps_lifetime, again.skipped_steps_lifetime) == (5, 3)
    assert not _changed(after, _weights(restored))
    _update(restored, episodes)
    assert again.optimizer_steps_lifetime == 6
