"""The checks behind docs/dqn.md's "APPO on Pong": is APPO on one machine (a local EnvRunner,
a local learner) learning at all, and how many updates does it make?

    python docs/appo/appo_checks.py updates 2000   # env steps trained vs sampled, 4 iterations
    python docs/appo/appo_checks.py updates 500 amp-native-2epochs   # the same, another path
    python docs/appo/appo_checks.py entropy pong-appo stock RUN/checkpoints/stock-seed0/iter_N
    python docs/appo/appo_checks.py sync           # the EnvRunner's weights follow the learner's
    python docs/appo/appo_checks.py cartpole amp   # APPO on CartPole to a mean return of 400
    python docs/appo/appo_checks.py cartpole fp32

Run from the repository root; each prints one line per iteration or run.
"""

import os
import sys
import time

sys.path.insert(0, os.getcwd())
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pong(batch: int | None, path: str = "amp-native", task: str = "pong-appo"):
    from studies.learning import build_config

    return build_config(path, 0, 3_000_000, "cpu", batch, task).build_algo()


def updates(batch: int, path: str = "amp-native") -> None:
    algo = pong(batch, path)
    for i in range(4):
        r = algo.train()
        trained = r["learners"].get("__all_modules__", {}).get("num_env_steps_trained_lifetime", 0)
        print(f"iteration {i}: sampled {r['num_env_steps_sampled_lifetime']:.0f}, "
              f"trained {trained:.0f} env steps (batch {batch}, {path})", flush=True)  # fmt: skip
    algo.stop()


def entropy(task: str, path: str, checkpoint: str) -> None:
    """The policy's entropy on its own samples (the learner's metric; a uniform policy over
    Pong's 6 actions has ln 6 = 1.79), a few iterations on from a study run's checkpoint."""
    algo = pong(None, path, task)
    algo.restore_from_path(checkpoint)
    for _ in range(3):
        r = algo.train()
        value = r["learners"]["default_policy"].get("entropy", float("nan"))
        print(f"{task} {path} at {r['num_env_steps_sampled_lifetime']:.0f} env steps: "
              f"entropy {value:.3f}", flush=True)  # fmt: skip
    algo.stop()


def sync() -> None:
    algo = pong(None)

    def weights(module):
        return {k: v.detach().clone() for k, v in module.state_dict().items()
                if v.dtype.is_floating_point}  # fmt: skip

    def runner():
        return weights(algo.env_runner.module)  # the runner's single-agent module

    def learner():
        return weights(algo.learner_group._learner.module["default_policy"])

    def gap(a, b):
        return max((a[k] - b[k]).abs().max().item() for k in a if k in b)

    r0, l0 = runner(), learner()
    for i in range(6):
        algo.train()
        r1, l1 = runner(), learner()
        print(f"iteration {i}: runner moved {gap(r1, r0):.4f}, learner moved {gap(l1, l0):.4f}, "
              f"runner - learner {gap(r1, l1):.4f}", flush=True)  # fmt: skip
    algo.stop()


def cartpole(path: str) -> None:
    from ray.rllib.algorithms.appo import APPOConfig

    from rllib_amp import with_amp

    cfg = (
        APPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8)
        .learners(num_learners=0)
        .training(vf_loss_coeff=0.05, entropy_coeff=0.0)  # RLlib's cartpole_appo.py
        .debugging(seed=0)
    )
    if path == "amp":
        cfg = with_amp(cfg, dtype="bfloat16")
    algo = cfg.build_algo()
    start = time.perf_counter()
    while True:
        r = algo.train()
        steps = r["num_env_steps_sampled_lifetime"]
        ret = r["env_runners"].get("episode_return_mean") or float("nan")
        if ret >= 400 or steps > 300_000:
            break
    trained = r["learners"]["__all_modules__"]["num_env_steps_trained_lifetime"]
    print(f"{path}: return {ret:.1f} at {steps:.0f} env steps ({trained:.0f} trained), "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    algo.stop()


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    {"updates": lambda: updates(int(rest[0]), *rest[1:]), "sync": sync,
     "entropy": lambda: entropy(*rest),
     "cartpole": lambda: cartpole(rest[0])}[what]()  # fmt: skip
