"""Population Based Training and AMP: which settings an exploit cannot carry over.

PBT copies a donor trial's checkpoint into a recipient and changes some of its settings. The
scalers' live state travels with the checkpoint, so a setting that only seeds a fresh scaler
would no longer describe the trial after an exploit.

Example:
    >>> check_pbt_mutations({"amp.growth_interval": [100, 2000]})  # may mutate: no error
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rllib_amp.checks import dotted
from rllib_amp.settings import AMP_CONFIG_KEY

# Settings that a PBT exploit cannot carry over, and why; every other AMP setting may mutate.
_NOT_MUTABLE_UNDER_PBT = {
    "init_scale": (
        "init_scale only seeds a fresh scaler: after an exploit the recipient continues at the "
        "donor's live scale, so a trial's init_scale would no longer describe it. Set "
        "amp.init_scale once (or seed the scale with amp.warm_start) and let PBT mutate "
        "amp.growth_interval, amp.growth_factor or amp.backoff_factor; to compare init_scale "
        "values, sweep them without PBT"
    ),
    "warm_start": (
        "warm_start seeds the scalers only when a trial starts: after an exploit the scales "
        "come from the donor's checkpoint. Set amp.warm_start once, outside search and "
        "hyperparam_mutations"
    ),
}


def check_pbt_mutations(mutations: Mapping[str, Any], *, searched: Iterable[str] = ()) -> None:
    """Refuses AMP settings that Population Based Training cannot change mid-run.

    ``mutations`` is PBT's ``hyperparam_mutations`` (flat dotted keys such as
    ``amp.init_scale``, or nested mappings); ``searched`` the keys of the initial search.
    An AMP key is a field name, alone or under ``amp.`` / ``learner_config_dict.rllib_amp.``.
    Raises ValueError naming the key, why, and the fix. growth_interval, growth_factor and
    backoff_factor may mutate: a recipient keeps its own and continues the donor's scale.

    Example:
        >>> check_pbt_mutations({"amp.growth_interval": [100, 2000], "training.lr": [1e-4]})
        >>> check_pbt_mutations({"amp": {"init_scale": [1024.0]}})
        Traceback (most recent call last):
        ...
        ValueError: hyperparam_mutations.amp.init_scale: cannot change under PBT: ...
    """
    keyed = [("hyperparam_mutations", k) for k in dotted(mutations)]
    keyed += [("search", str(k)) for k in searched]
    for where, key in keyed:
        parts = key.split(".")
        for i, part in enumerate(parts):
            owner = ".".join(parts[:i])
            if part in _NOT_MUTABLE_UNDER_PBT and owner in (
                "",
                "amp",
                AMP_CONFIG_KEY,
                f"learner_config_dict.{AMP_CONFIG_KEY}",
            ):
                raise ValueError(
                    f"{where}.{key}: cannot change under PBT: {_NOT_MUTABLE_UNDER_PBT[part]}"
                )
