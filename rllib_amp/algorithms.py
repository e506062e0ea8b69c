"""The algorithms rllib-amp supports: one record each, read by every other module.

A record names the algorithm, its RLlib config class, RLlib's torch learner, the rllib-amp
learner that replaces it, RLlib's default torch RLModule, that module taking uint8 image
observations (the native Atari path) and that one with BatchNorm. To support another
algorithm, add its AMP learner class and one record here.

The registry's names load without RLlib: a record's classes, and the module-level AMP
classes (``AmpPPOTorchLearner``, ...), are made on first use, so an experiment file with a
misspelt algorithm is refused before torch and RLlib are imported.

Example:
    >>> ALGORITHMS["PPO"].amp_learner.__name__
    'AmpPPOTorchLearner'
    >>> from ray.rllib.algorithms.dqn import DQNConfig
    >>> algorithm_for_config(DQNConfig()).name
    'DQN'
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rllib_amp.checks import suggest

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm as RLlibAlgorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

# The AMP learners, algorithms and RLModules have module-level names so that Ray and RLlib's
# checkpoints pickle them by reference; pickle finds them through ``__getattr__``.
_RLLIB_NAMES = (
    "AmpPPOTorchLearner",
    "AmpDQNTorchLearner",
    "AmpAPPOTorchLearner",
    "AmpPPO",
    "AmpDQN",
    "AmpAPPO",
    "Uint8DefaultPPOTorchRLModule",
    "Uint8DefaultDQNTorchRLModule",
    "Uint8DefaultAPPOTorchRLModule",
    "BatchNormDefaultPPOTorchRLModule",
    "BatchNormDefaultDQNTorchRLModule",
    "BatchNormDefaultAPPOTorchRLModule",
)


@dataclass(frozen=True)
class ResultKeys:
    """What one algorithm reports beyond the keys every algorithm reports."""

    top: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    # Per-module learner keys worth suggesting (the losses people stop or rank on).
    learner: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Classes:
    """The part of a record that needs RLlib."""

    config_class: type[AlgorithmConfig]
    learner: type[TorchLearner]
    amp_learner: type[TorchLearner]
    module: type
    uint8_module: type
    batchnorm_module: type
    algorithm_class: type[RLlibAlgorithm]
    amp_algorithm: type[RLlibAlgorithm]
    results: ResultKeys


@dataclass(frozen=True)
class Algorithm:
    """One supported algorithm and the classes rllib-amp uses for it.

    ``minibatches``: the learner splits each train batch into minibatches
    (``minibatch_size``, ``num_epochs``); ``results``: the result keys it adds. The class
    fields import RLlib on first use.
    """

    name: str
    minibatches: bool

    @property
    def _classes(self) -> _Classes:
        return _rllib_classes()[self.name]

    @property
    def config_class(self) -> type[AlgorithmConfig]:
        return self._classes.config_class

    @property
    def learner(self) -> type[TorchLearner]:
        return self._classes.learner

    @property
    def amp_learner(self) -> type[TorchLearner]:
        return self._classes.amp_learner

    @property
    def module(self) -> type:
        return self._classes.module

    @property
    def uint8_module(self) -> type:
        return self._classes.uint8_module

    @property
    def batchnorm_module(self) -> type:
        return self._classes.batchnorm_module

    @property
    def algorithm_class(self) -> type[RLlibAlgorithm]:
        return self._classes.algorithm_class

    @property
    def amp_algorithm(self) -> type[RLlibAlgorithm]:
        return self._classes.amp_algorithm

    @property
    def results(self) -> ResultKeys:
        return self._classes.results


# In the order messages list them.
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("PPO", minibatches=True),
        Algorithm("DQN", minibatches=False),
        Algorithm("APPO", minibatches=True),
    )
}

_LOCK = threading.Lock()
_CLASSES: dict[str, _Classes] = {}


def _rllib_classes() -> dict[str, _Classes]:
    """Each record's RLlib classes, made once: two threads must not make two AmpPPO classes,
    or a checkpoint would name one and Ray's workers hold the other."""
    if _CLASSES:
        return _CLASSES
    with _LOCK:
        if not _CLASSES:
            _CLASSES.update(_define_rllib_classes())
    return _CLASSES


def _define_rllib_classes() -> dict[str, _Classes]:
    from ray.rllib.algorithms import appo, ppo
    from ray.rllib.algorithms.appo import APPO, APPOConfig
    from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
    from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import (
        DefaultAPPOTorchRLModule,
    )
    from ray.rllib.algorithms.dqn import DQN, DQNConfig, dqn_learner
    from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import (
        DefaultDQNTorchRLModule,
    )
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
    from ray.rllib.algorithms.ppo import PPO, PPOConfig
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core.learner import learner as rllib_learner
    from ray.rllib.utils import metrics as M

    from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin
    from rllib_amp.envs.models import with_batchnorm, with_uint8_images
    from rllib_amp.learner.mixin import AmpLearnerMixin

    def named(name: str, bases: tuple[type, ...], doc: str) -> type:
        return type(name, bases, {"__doc__": doc, "__module__": __name__})

    learner_doc = "torch learner with autocast and a checkpointed GradScaler per policy."
    algorithm_doc = "with verified restores and checksummed checkpoints."
    made: dict[str, Any] = {
        "AmpPPOTorchLearner": named(
            "AmpPPOTorchLearner", (AmpLearnerMixin, PPOTorchLearner), f"PPO's {learner_doc}"
        ),
        "AmpDQNTorchLearner": named(
            "AmpDQNTorchLearner",
            (AmpLearnerMixin, DQNTorchLearner),
            "DQN's torch learner (target network, double Q) with autocast and per-policy scalers.",
        ),
        "AmpAPPOTorchLearner": named(
            "AmpAPPOTorchLearner", (AmpLearnerMixin, APPOTorchLearner), f"APPO's {learner_doc}"
        ),
        "AmpPPO": named("AmpPPO", (AmpAlgorithmMixin, PPO), f"RLlib's PPO {algorithm_doc}"),
        "AmpDQN": named("AmpDQN", (AmpAlgorithmMixin, DQN), f"RLlib's DQN {algorithm_doc}"),
        "AmpAPPO": named("AmpAPPO", (AmpAlgorithmMixin, APPO), f"RLlib's APPO {algorithm_doc}"),
    }
    defaults = {
        "PPO": DefaultPPOTorchRLModule,
        "DQN": DefaultDQNTorchRLModule,
        "APPO": DefaultAPPOTorchRLModule,
    }
    for algo, module in defaults.items():
        uint8 = with_uint8_images(module)
        made[f"Uint8Default{algo}TorchRLModule"] = uint8
        # BatchNorm modules take uint8 and float observations alike; their names predate
        # uint8 input and are kept, so existing checkpoints still find them.
        name = f"BatchNormDefault{algo}TorchRLModule"
        made[name] = with_batchnorm(uint8, name=name)
    for cls in made.values():
        cls.__module__ = __name__
    globals().update(made)  # later lookups skip __getattr__

    policy_gradient_losses = (
        rllib_learner.POLICY_LOSS_KEY,
        rllib_learner.VF_LOSS_KEY,
        rllib_learner.ENTROPY_KEY,
    )
    results = {
        "PPO": ResultKeys(
            learner=(
                *policy_gradient_losses,
                ppo.ppo.LEARNER_RESULTS_KL_KEY,
                ppo.ppo.LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
            ),
        ),
        "DQN": ResultKeys(
            scopes=("replay_buffer",),
            learner=(
                dqn_learner.QF_LOSS_KEY,
                dqn_learner.TD_ERROR_MEAN_KEY,
                dqn_learner.QF_MEAN_KEY,
            ),
        ),
        "APPO": ResultKeys(
            top=(
                M.MEAN_NUM_LEARNER_GROUP_UPDATE_CALLED,
                M.NUM_SYNCH_WORKER_WEIGHTS,
                M.NUM_TRAINING_STEP_CALLS_SINCE_LAST_SYNCH_WORKER_WEIGHTS,
            ),
            scopes=("learner_group",),
            learner=(*policy_gradient_losses, appo.appo.LEARNER_RESULTS_KL_KEY),
        ),
    }
    # (config class, RLlib's torch learner, RLlib's algorithm)
    rllib: dict[str, tuple[Any, Any, Any]] = {
        "PPO": (PPOConfig, PPOTorchLearner, PPO),
        "DQN": (DQNConfig, DQNTorchLearner, DQN),
        "APPO": (APPOConfig, APPOTorchLearner, APPO),
    }
    return {
        algo: _Classes(
            config_class=config_class,
            learner=learner,
            amp_learner=made[f"Amp{algo}TorchLearner"],
            module=defaults[algo],
            uint8_module=made[f"Uint8Default{algo}TorchRLModule"],
            batchnorm_module=made[f"BatchNormDefault{algo}TorchRLModule"],
            algorithm_class=algorithm_class,
            amp_algorithm=made[f"Amp{algo}"],
            results=results[algo],
        )
        for algo, (config_class, learner, algorithm_class) in rllib.items()
    }


def __getattr__(name: str) -> Any:
    if name in _RLLIB_NAMES:
        _rllib_classes()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_RLLIB_NAMES})


def algorithm(name: str) -> Algorithm:
    """The record for ``name`` (case-insensitive); ValueError names the supported ones.

    Example:
        >>> algorithm("appo").config_class.__name__
        'APPOConfig'
    """
    record = ALGORITHMS.get(str(name).upper())
    if record is None:
        raise ValueError(
            f"algorithm: {name!r} is not supported{suggest(str(name), ALGORITHMS)}; "
            f"allowed: {', '.join(ALGORITHMS)}"
        )
    return record


def algorithm_for_config(config: AlgorithmConfig) -> Algorithm | None:
    """The record whose config class ``config`` is an instance of, most specific first."""
    matches = [a for a in ALGORITHMS.values() if isinstance(config, a.config_class)]
    # APPOConfig is no PPOConfig subclass in RLlib today; prefer the deepest class anyway.
    matches.sort(key=lambda a: len(a.config_class.__mro__), reverse=True)
    return matches[0] if matches else None


# One class per (mixin, base), so that Ray and checkpoints see the same class each time.
_SUBCLASSES: dict[tuple[type, type], type] = {}


def amp_subclass(
    mixin: type, base: Any, *, root: type, known: Mapping[type, type], doc: str, caller: str
) -> type:
    """``base`` (a subclass of RLlib's ``root``) with ``mixin`` in front: ``base`` itself if
    it has the mixin, the registry's class for RLlib's own ``base``, else ``Amp<base>``, made
    once per base. TypeError, naming ``caller``, for anything but a subclass of ``root``.

    Example:
        >>> from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
        >>> from ray.rllib.core.learner.torch.torch_learner import TorchLearner
        >>> from rllib_amp.learner.mixin import AmpLearnerMixin
        >>> amp_subclass(AmpLearnerMixin, PPOTorchLearner, root=TorchLearner, known={},
        ...              doc="", caller="f").__name__
        'AmpPPOTorchLearner'
    """
    if not isinstance(base, type) or not issubclass(base, root):
        raise TypeError(
            f"{caller}: expected a subclass of RLlib's {root.__name__}, got {base!r}; pass "
            f"e.g. {next(iter(known), root).__name__} or your own {root.__name__} subclass"
        )
    if issubclass(base, mixin):
        return base
    if base in known:
        return known[base]
    if (mixin, base) not in _SUBCLASSES:
        name, text = f"Amp{base.__name__}", f"{base.__name__} {doc}"
        _SUBCLASSES[mixin, base] = type(name, (mixin, base), {"__doc__": text})
    return _SUBCLASSES[mixin, base]


def amp_learner_class(base_learner_cls: type) -> type:
    """The mixed-precision version of a TorchLearner subclass (yours or RLlib's).

    Example:
        >>> from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
        >>> amp_learner_class(PPOTorchLearner).__name__
        'AmpPPOTorchLearner'
    """
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    from rllib_amp.learner.mixin import AmpLearnerMixin

    return amp_subclass(
        AmpLearnerMixin,
        base_learner_cls,
        root=TorchLearner,
        known={a.learner: a.amp_learner for a in ALGORITHMS.values()},
        doc="with rllib-amp mixed precision.",
        caller="amp_learner_class",
    )


def amp_algorithm_class(base: type) -> type:
    """The version of an Algorithm class (RLlib's or yours) with all-or-nothing restores
    (``rllib_amp.checkpoints.algorithm``).

    Example:
        >>> from ray.rllib.algorithms.dqn import DQN
        >>> issubclass(amp_algorithm_class(DQN), DQN)
        True
    """
    from ray.rllib.algorithms.algorithm import Algorithm as RLlibAlgorithm

    from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin

    return amp_subclass(
        AmpAlgorithmMixin,
        base,
        root=RLlibAlgorithm,
        known={a.algorithm_class: a.amp_algorithm for a in ALGORITHMS.values()},
        doc="with verified restores and checksummed checkpoints.",
        caller="amp_algorithm_class",
    )
