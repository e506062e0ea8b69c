"""Algorithm checkpoints that restore all or nothing; ``with_amp`` sets these classes.

RLlib's ``Algorithm.restore_from_path`` loads the learner group first, then the env runner,
then the algorithm's own state, so a damaged file found on the way leaves the weights and
scaler state already replaced. ``Algorithm.from_checkpoint`` and a Tune trial's restore both
end in that method. ``AmpAlgorithmMixin`` wraps it: the whole checkpoint is read and checked
(``checkpoint_files.verify_checkpoint``) before RLlib loads anything. Every save writes a
manifest of checksums after RLlib's own files, so bytes changed later are caught too.

Example:
    >>> from ray.rllib.algorithms.ppo import PPO
    >>> amp_algorithm_class(PPO).__name__
    'AmpPPO'
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.appo import APPO
from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.ppo import PPO
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_amp.checkpoints.verify import verify_checkpoint, write_manifest
from rllib_amp.fs import resolve

# Type checkers see the mixin as an Algorithm; at run time it is a plain mixin.
_MixinBase: Any = Algorithm if TYPE_CHECKING else object


class AmpAlgorithmMixin(_MixinBase):
    """Verified restores and a checksum manifest per save, for any RLlib Algorithm class.

    Use ``amp_algorithm_class(base)`` rather than subclassing by hand.
    """

    @override(Checkpointable)
    def save_to_path(
        self,
        path: Any = None,
        *,
        state: Any = None,
        filesystem: Any = None,
        use_msgpack: bool = False,
    ) -> str:
        if path is not None and filesystem is None:
            # Resolved once, so that RLlib and the manifest write to the same place.
            filesystem, path = resolve(path)
        saved = super().save_to_path(
            path, state=state, filesystem=filesystem, use_msgpack=use_msgpack
        )
        write_manifest(saved, filesystem=filesystem)
        return str(saved)

    @override(Algorithm)
    def restore_from_path(self, path: Any, *args: Any, **kwargs: Any) -> None:
        verify_checkpoint(path, filesystem=kwargs.get("filesystem"))
        super().restore_from_path(path, *args, **kwargs)


# Module-level names, so that checkpoints and Ray pickle these classes by reference.
class AmpPPO(AmpAlgorithmMixin, PPO):
    """RLlib's PPO with verified restores and checksummed checkpoints."""


class AmpDQN(AmpAlgorithmMixin, DQN):
    """RLlib's DQN with verified restores and checksummed checkpoints."""


class AmpAPPO(AmpAlgorithmMixin, APPO):
    """RLlib's APPO with verified restores and checksummed checkpoints."""


_KNOWN: dict[type, type] = {PPO: AmpPPO, DQN: AmpDQN, APPO: AmpAPPO}


def amp_algorithm_class(base: type) -> type:
    """The version of an Algorithm class (RLlib's or yours) with all-or-nothing restores.

    Example:
        >>> from ray.rllib.algorithms.dqn import DQN
        >>> issubclass(amp_algorithm_class(DQN), DQN)
        True
    """
    if isinstance(base, type) and issubclass(base, Algorithm):
        wrapped = issubclass(base, AmpAlgorithmMixin)
        return base if wrapped else _KNOWN.get(base) or _made_class(base)
    raise TypeError(
        f"amp_algorithm_class: expected a subclass of RLlib's Algorithm, got {base!r}; "
        f"pass e.g. PPO or your own Algorithm subclass"
    )


@functools.cache
def _made_class(base: type) -> type:
    return type(
        f"Amp{base.__name__}",
        (AmpAlgorithmMixin, base),
        {"__doc__": f"{base.__name__} with verified restores and checksummed checkpoints."},
    )
