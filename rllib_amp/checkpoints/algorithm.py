"""Algorithm checkpoints that restore all or nothing; ``with_amp`` sets these classes.

RLlib's ``Algorithm.restore_from_path`` loads the learner group first, then the env runner,
then the algorithm's own state, so a damaged file found on the way leaves the weights and
scaler state already replaced. ``Algorithm.from_checkpoint`` and a Tune trial's restore both
end in that method. ``AmpAlgorithmMixin`` wraps it: the whole checkpoint is read and checked
(``rllib_amp.checkpoint_files.verify_checkpoint``) before RLlib loads anything, including that
every state file RLlib's restore will read for this algorithm is there, with or without a
manifest (``rllib_restore_files``). Every save writes a manifest of checksums after RLlib's own
files, so bytes changed later are caught too.

The algorithm registry (``rllib_amp.algorithms.amp_algorithm_class``) puts the mixin in
front of each Algorithm class.

Example:
    >>> from rllib_amp.algorithms import amp_algorithm_class
    >>> from ray.rllib.algorithms.ppo import PPO
    >>> amp_algorithm_class(PPO).__name__
    'AmpPPO'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_amp.checkpoint_files import rllib_restore_files, verify_checkpoint, write_manifest
from rllib_amp.fs import resolve

# Type checkers see the mixin as an Algorithm; at run time it is a plain mixin.
_MixinBase: Any = Algorithm if TYPE_CHECKING else object


class AmpAlgorithmMixin(_MixinBase):
    """Verified restores and a checksum manifest per save, for any RLlib Algorithm class.

    Use ``rllib_amp.algorithms.amp_algorithm_class(base)`` rather than subclassing by hand.
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
        filesystem = kwargs.get("filesystem")
        # A whole-algorithm restore reads each component's state file: all must be there
        # (with or without a manifest) before RLlib replaces the first of them.
        required = (
            rllib_restore_files(self, path, filesystem=filesystem)
            if kwargs.get("component") is None
            else []
        )
        verify_checkpoint(path, filesystem=filesystem, required=required)
        super().restore_from_path(path, *args, **kwargs)
