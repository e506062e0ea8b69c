"""The algorithms rllib-amp supports: one row each in ``ALGORITHMS``, read by every other module.

A row gives the algorithm's name (RLlib's spelling), whether its learner splits the train
batch into minibatches, and the result keys it reports beyond the common ones. Every class
follows from the name ``X`` (package ``x`` under ``ray.rllib.algorithms``): RLlib's ``X``,
``XConfig``, ``XTorchLearner`` and ``DefaultXTorchRLModule``, and rllib-amp's
``AmpXTorchLearner``, ``AmpX``, ``Uint8DefaultXTorchRLModule`` (uint8 image observations, the
native Atari path) and ``BatchNormDefaultXTorchRLModule``. Another algorithm needs its row
(and a field, where RLlib names its classes otherwise, as MARWIL).

What a row cannot check: the learner must back-propagate ``loss_per_module``, as PPO, DQN,
MARWIL/BC and IMPALA/APPO do, not SAC, CQL, TQC, IQL or DreamerV3 (docs/update-step.md).

Names load without RLlib: a row's classes, and the module-level AMP classes, are made on
first use, so a misspelt algorithm is refused before torch and RLlib are imported.

Example:
    >>> ALGORITHMS["PPO"].amp_learner.__name__
    'AmpPPOTorchLearner'
    >>> from ray.rllib.algorithms.dqn import DQNConfig
    >>> algorithm_for_config(DQNConfig()).name
    'DQN'
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rllib_amp.checks import suggest

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

T = TypeVar("T")


class _FromRLlib(Generic[T]):
    """A row's class (or RLlib-named value), looked up in ``_rllib_classes`` on first use."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, row: Algorithm | None, owner: type | None = None) -> T:
        if row is None:  # looked up on the class (documentation tools)
            return self  # type: ignore[return-value]
        return _rllib_classes()[row.name][self.name]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Algorithm:
    """One supported algorithm and the classes rllib-amp uses for it (imported on first use).

    ``minibatches``: the learner splits each train batch (``minibatch_size``, ``num_epochs``).
    Result keys beyond the common ones (``learner_keys``: the per-module losses people stop or
    rank on): RLlib constants as ``"module.CONSTANT"`` under ``ray.rllib``; scopes literal.
    """

    name: str
    minibatches: bool
    top_keys: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    learner_keys: tuple[str, ...] = ()

    config_class = _FromRLlib[type]()
    learner = _FromRLlib[type]()
    amp_learner = _FromRLlib[type]()
    module = _FromRLlib[type]()
    uint8_module = _FromRLlib[type]()
    batchnorm_module = _FromRLlib[type]()
    algorithm_class = _FromRLlib[type]()
    amp_algorithm = _FromRLlib[type]()


_LOSSES = tuple(
    f"core.learner.learner.{k}" for k in ("POLICY_LOSS_KEY", "VF_LOSS_KEY", "ENTROPY_KEY")
)
# In the order messages list them.
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "PPO",
            minibatches=True,
            learner_keys=(
                *_LOSSES,
                "algorithms.ppo.ppo.LEARNER_RESULTS_KL_KEY",
                "algorithms.ppo.ppo.LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY",
            ),
        ),
        Algorithm(
            "DQN",
            minibatches=False,
            scopes=("replay_buffer",),
            learner_keys=tuple(
                f"algorithms.dqn.dqn_learner.{k}"
                for k in ("QF_LOSS_KEY", "TD_ERROR_MEAN_KEY", "QF_MEAN_KEY")
            ),
        ),
        Algorithm(
            "APPO",
            minibatches=True,
            scopes=("learner_group",),
            top_keys=tuple(
                f"utils.metrics.{k}"
                for k in (
                    "MEAN_NUM_LEARNER_GROUP_UPDATE_CALLED",
                    "NUM_SYNCH_WORKER_WEIGHTS",
                    "NUM_TRAINING_STEP_CALLS_SINCE_LAST_SYNCH_WORKER_WEIGHTS",
                )
            ),
            learner_keys=(*_LOSSES, "algorithms.appo.appo.LEARNER_RESULTS_KL_KEY"),
        ),
    )
}

# The AMP learners, algorithms and RLModules have module-level names so that Ray and RLlib's
# checkpoints pickle them by reference; pickle finds them through ``__getattr__``.
_AMP_NAMES = {
    "amp_learner": "Amp{}TorchLearner",
    "amp_algorithm": "Amp{}",
    "uint8_module": "Uint8Default{}TorchRLModule",
    "batchnorm_module": "BatchNormDefault{}TorchRLModule",
}
_RLLIB_NAMES = tuple(n.format(a) for a in ALGORITHMS for n in _AMP_NAMES.values())

_LOCK = threading.Lock()
_CLASSES: dict[str, dict[str, Any]] = {}


def _rllib_classes() -> dict[str, dict[str, Any]]:
    """Each row's RLlib classes, made once: two threads must not make two AmpPPO classes,
    or a checkpoint would name one and Ray's workers hold the other."""
    if _CLASSES:
        return _CLASSES
    with _LOCK:
        if not _CLASSES:
            _CLASSES.update({a.name: _define_rllib_classes(a) for a in ALGORITHMS.values()})
    return _CLASSES


def rllib_value(reference: str) -> Any:
    """``"module.NAME"`` under ``ray.rllib`` -> its value."""
    module, name = reference.rsplit(".", 1)
    return getattr(importlib.import_module(f"ray.rllib.{module}"), name)


def _define_rllib_classes(row: Algorithm) -> dict[str, Any]:
    """A row's classes by field name; the AMP ones are made here, named in this module."""
    from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin
    from rllib_amp.envs.models import with_batchnorm, with_uint8_images
    from rllib_amp.learner.mixin import AmpLearnerMixin

    x, package = row.name, row.name.lower()
    rllib = f"algorithms.{package}"
    learner = rllib_value(f"{rllib}.torch.{package}_torch_learner.{x}TorchLearner")
    module = rllib_value(f"{rllib}.torch.default_{package}_torch_rl_module.Default{x}TorchRLModule")
    algorithm_class = rllib_value(f"{rllib}.{x}")
    names = {field: name.format(x) for field, name in _AMP_NAMES.items()}
    learner_doc = f"{x}'s torch learner with autocast and a checkpointed GradScaler per policy."
    algorithm_doc = f"RLlib's {x} with verified restores and checksummed checkpoints."
    uint8 = with_uint8_images(module)
    made: dict[str, Any] = {
        "amp_learner": type(
            names["amp_learner"], (AmpLearnerMixin, learner), {"__doc__": learner_doc}
        ),
        "amp_algorithm": type(
            names["amp_algorithm"], (AmpAlgorithmMixin, algorithm_class), {"__doc__": algorithm_doc}
        ),
        "uint8_module": uint8,
        # BatchNorm modules take uint8 and float observations alike; their names predate
        # uint8 input and are kept, so existing checkpoints still find them.
        "batchnorm_module": with_batchnorm(uint8, name=names["batchnorm_module"]),
    }
    for cls in made.values():
        cls.__module__ = __name__
    globals().update({names[field]: cls for field, cls in made.items()})  # skip __getattr__
    return {
        **made,
        "config_class": rllib_value(f"{rllib}.{x}Config"),
        "learner": learner,
        "module": module,
        "algorithm_class": algorithm_class,
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
    return max(matches, key=lambda a: len(a.config_class.__mro__), default=None)


# One class per (mixin, base), so that Ray and checkpoints see the same class each time.
_SUBCLASSES: dict[tuple[type, type], type] = {}


def amp_subclass(
    mixin: type, base: Any, *, root: type, known: Mapping[type, type], doc: str, caller: str
) -> type:
    """``base`` (a subclass of RLlib's ``root``) with ``mixin`` in front: ``base`` itself if
    it has the mixin, ``known[base]``, else ``Amp<base>``, made once per base. TypeError,
    naming ``caller``, for anything but a subclass of ``root``."""
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
