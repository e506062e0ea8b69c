"""The ``tune`` section and Population Based Training: its settings, and which AMP settings
an exploit cannot carry over.

PBT copies a donor trial's checkpoint into a recipient and changes some of its settings. The
scalers' live state travels with the checkpoint, so a setting that only seeds a fresh scaler
would no longer describe the trial after an exploit.

Example:
    >>> check_pbt_mutations({"amp.growth_interval": [100, 2000]})  # may mutate: no error
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

from rllib_amp.checks import dotted, suggest
from rllib_amp.experiment.errors import (
    ExperimentError,
    check_keys,
    check_mapping,
    check_number,
    err,
)
from rllib_amp.experiment.sampler import Sampler
from rllib_amp.settings import AMP_CONFIG_KEY

if TYPE_CHECKING:
    from rllib_amp.experiment.data import ExperimentData, PbtSection, SamplerSpec, TuneSection

CheckValues = Callable[["ExperimentData", str, Sampler, str, str], None]

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

# Where an AMP setting's name may sit in a mutation's key.
_AMP_OWNERS = ("", "amp", AMP_CONFIG_KEY, f"learner_config_dict.{AMP_CONFIG_KEY}")


def check_pbt_mutations(mutations: Mapping[str, object], *, searched: Iterable[str] = ()) -> None:
    """Refuses AMP settings that Population Based Training cannot change mid-run.

    Args:
        mutations: PBT's ``hyperparam_mutations``, flat dotted keys (``amp.init_scale``) or
            nested mappings; an AMP key is a field name, alone or under ``amp.``,
            ``rllib_amp.`` or ``learner_config_dict.rllib_amp.``.
        searched: The keys of the initial search.

    Raises ValueError naming the key, why, and the fix.

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
            if part in _NOT_MUTABLE_UNDER_PBT and ".".join(parts[:i]) in _AMP_OWNERS:
                raise ValueError(
                    f"{where}.{key}: cannot change under PBT: {_NOT_MUTABLE_UNDER_PBT[part]}"
                )


SCHEDULERS = ("fifo", "asha", "pbt")
TUNE_DEFAULTS: dict[str, object] = {
    "metric": "env_runners/episode_return_mean",
    "mode": "max",
    "num_samples": 1,
    "scheduler": "fifo",
    "max_concurrent_trials": None,
    "max_failures": 2,
    "pbt": None,
}
# tune.pbt: Population Based Training (tune.scheduler: pbt). perturbation_interval counts
# training iterations; the rest are Tune's PopulationBasedTraining arguments.
PBT_DEFAULTS: dict[str, object] = {
    "perturbation_interval": None,
    "hyperparam_mutations": None,
    "quantile_fraction": 0.25,
    "resample_probability": 0.25,
    "burn_in_period": 0,
    "synch": False,
}
# Sections PBT may mutate: a restore into another model or other resources would not fit the
# donor's checkpoint.
MUTABLE = ("amp", "training")
PBT_EXAMPLE = (
    "tune: {scheduler: pbt, pbt: {perturbation_interval: 2, hyperparam_mutations: "
    "{training.lr: {loguniform: [1.0e-4, 1.0e-3]}, amp.growth_interval: [10, 100, 2000]}}}"
)


def check_tune(
    value: object, exp: ExperimentData, path: str, check_values: CheckValues
) -> TuneSection:
    """The ``tune`` section, normalised; ``check_values`` is the schema's check of a search
    entry's values, for PBT's mutations."""
    given = check_mapping(path, "tune", value)
    check_keys(path, "tune", given, TUNE_DEFAULTS)
    t = {**TUNE_DEFAULTS, **given}
    if not isinstance(t["metric"], str) or not t["metric"]:
        raise err(path, "tune.metric", f"got {t['metric']!r}; expected a result key")
    if t["mode"] not in ("max", "min"):
        raise err(path, "tune.mode", f"got {t['mode']!r}; allowed: max, min")
    if t["scheduler"] not in SCHEDULERS:
        raise err(
            path,
            "tune.scheduler",
            f"got {t['scheduler']!r}{suggest(str(t['scheduler']), SCHEDULERS)}; "
            f"allowed: {', '.join(SCHEDULERS)}",
        )
    check_number(path, "tune.num_samples", t["num_samples"], (int,), 1)
    check_number(path, "tune.max_failures", t["max_failures"], (int,), 0)
    if t["max_concurrent_trials"] is not None:
        check_number(path, "tune.max_concurrent_trials", t["max_concurrent_trials"], (int,), 1)
    if t["scheduler"] == "pbt":
        t["pbt"] = _pbt(t["pbt"], exp, path, check_values)
    elif t["pbt"] is not None:
        raise err(
            path,
            "tune.pbt",
            f"set, but tune.scheduler is {t['scheduler']!r}; add 'scheduler: pbt' or drop pbt",
        )
    return cast("TuneSection", t)  # every key checked above, or a default


def _pbt(value: object, exp: ExperimentData, path: str, check_values: CheckValues) -> PbtSection:
    """tune.pbt, normalised: every mutation a sampler spec ({choice: [...]} for a list)."""
    if value is None:
        raise err(path, "tune.pbt", f"missing for scheduler pbt; add e.g. {PBT_EXAMPLE}")
    given = check_mapping(path, "tune.pbt", value)
    check_keys(path, "tune.pbt", given, PBT_DEFAULTS)
    pbt = {**PBT_DEFAULTS, **given}
    for key in ("perturbation_interval", "hyperparam_mutations"):
        if pbt[key] is None:
            raise err(path, f"tune.pbt.{key}", f"missing; add e.g. {PBT_EXAMPLE}")
    check_number(path, "tune.pbt.perturbation_interval", pbt["perturbation_interval"], (int,), 1)
    check_number(path, "tune.pbt.quantile_fraction", pbt["quantile_fraction"], (int, float), 0, 0.5)
    check_number(
        path, "tune.pbt.resample_probability", pbt["resample_probability"], (int, float), 0, 1
    )
    check_number(path, "tune.pbt.burn_in_period", pbt["burn_in_period"], (int,), 0)
    if not isinstance(pbt["synch"], bool):
        raise err(path, "tune.pbt.synch", f"got {pbt['synch']!r}; expected true or false")
    where = "tune.pbt.hyperparam_mutations"
    mutations = check_mapping(path, where, pbt["hyperparam_mutations"])
    if not mutations:
        raise err(path, where, f"empty; name at least one key to mutate, e.g. {PBT_EXAMPLE}")
    try:
        check_pbt_mutations(mutations)
    except ValueError as e:
        raise ExperimentError(f"{path}: tune.pbt.{e}") from None
    out: dict[str, SamplerSpec] = {}
    for key, spec in mutations.items():
        key = str(key)
        top, *rest = key.split(".")
        if top not in MUTABLE or len(rest) != 1 or not rest[0]:
            raise err(
                path,
                f"{where}.{key}",
                f"PBT mutates one key of {' or '.join(MUTABLE)}{suggest(top, MUTABLE)}, "
                f"written flat, e.g. training.lr or amp.growth_interval",
            )
        if isinstance(spec, list):
            spec = {"choice": spec}
        try:
            sampler = Sampler.parse(spec)
        except ValueError as e:
            raise err(path, f"{where}.{key}", f"{e}; or give a list of values") from None
        if sampler.kind == "grid":
            raise err(
                path,
                f"{where}.{key}",
                "grid multiplies trials and PBT does not; give a list of values (PBT moves "
                "to a neighbouring one) or a range such as {loguniform: [lo, hi]}",
            )
        check_values(exp, key, sampler, f"{where}.{key}", path)
        out[key] = sampler.to_dict()
    pbt["hyperparam_mutations"] = out
    return cast("PbtSection", pbt)  # every key checked above, or a default


def check_pbt_needs(exp: ExperimentData, path: str) -> None:
    """What PBT needs of the sections after ``tune``: no init_scale or warm_start in the
    search, and a checkpoint at least every perturbation_interval for exploits to copy."""
    pbt = exp["tune"]["pbt"]
    if pbt is None:
        return
    try:
        check_pbt_mutations({}, searched=exp["search"])
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None
    interval = pbt["perturbation_interval"]
    frequency = exp["checkpoint"]["frequency"]
    if not 1 <= frequency <= interval:
        raise err(
            path,
            "checkpoint.frequency",
            f"got {frequency}; PBT copies a donor's latest checkpoint every "
            f"perturbation_interval ({interval}) iterations, so checkpoint at least that "
            f"often: set checkpoint.frequency to 1..{interval}",
        )
