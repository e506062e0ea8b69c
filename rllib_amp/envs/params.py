"""``python -m rllib_amp.params``: each model preset's parameter count, per algorithm.

Example:
    python -m rllib_amp.params --algorithms PPO,DQN
"""

from __future__ import annotations

from collections.abc import Sequence

from rllib_amp.algorithms import algorithm
from rllib_amp.cli import Parser, UsageError, main_wrapper
from rllib_amp.envs.models import PRESETS, count_parameters


def run(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m rllib_amp.params", description="Print each preset's size.")
    parser.add_argument("--algorithms", default="PPO,DQN", help="comma-separated")
    args = parser.parse_args(argv)
    try:
        algos = [algorithm(a.strip()) for a in args.algorithms.split(",") if a.strip()]
    except ValueError as e:
        raise UsageError(f"--algorithms: {e}") from None
    # Every module is built before the first line: what RLlib logs while building one (a
    # DeprecationWarning of its own) then comes before the table, not inside it.
    rows = [
        (preset, "84x84x4" if image else "vector",
         [count_parameters(a.config_class, preset, image=image) for a in algos])
        for image in (True, False)
        for preset in PRESETS
    ]  # fmt: skip
    print(f"{'preset':<8}{'input':<8}" + "".join(f"{a.name + ' params':>14}" for a in algos))
    for preset, kind, counts in rows:
        print(f"{preset:<8}{kind:<8}" + "".join(f"{c:>14,}" for c in counts))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper("python -m rllib_amp.params", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
