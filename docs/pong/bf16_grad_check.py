"""How far bfloat16 autocast moves PPO's gradient away from the float32 gradient on the same
batch, next to how far the gradient moves between two halves of one batch (sampling noise).

    python docs/pong/bf16_grad_check.py \
        results/pong_2026-12-02_amp_s2/checkpoints/amp-native-seed2/iter_000971

Restores a Pong run's checkpoint (``studies.learning``'s amp-native config; no argument: the
freshly initialised module), samples 2,048 env steps with its policy, builds the learner's
train batch once (advantages, value targets), then takes PPO's loss gradient on that batch
with the forward pass and loss in float32 and under bfloat16 autocast (as the amp-native
learner runs them; no update is applied). Prints one JSON line: the cosine and the relative
norm difference of the two gradients (all parameters, and per layer), and the same two
figures between the float32 gradients of the batch's two halves. docs/pong/bf16_grad_check.json
holds the 2026-12-02 output. See docs/pong.md.
"""

import json
import os
import sys

import torch
from ray.rllib.core.learner.training_data import TrainingData

from studies import learning as P

ckpt = sys.argv[1] if len(sys.argv) > 1 else None
torch.manual_seed(0)
algo = P.build_config("amp-native", 0, 3_000_000, "cpu", None).build_algo()
if ckpt:
    algo.restore_from_path(os.path.abspath(ckpt))  # RLlib reads a relative path as a URI
eps = algo.env_runner.sample(num_timesteps=2048, random_actions=False)
learner = algo.learner_group._learner
module = learner.module["default_policy"]
batch = learner._make_batch_if_necessary(TrainingData(episodes=eps))
batch = learner._convert_batch_type(batch) if hasattr(batch, "policy_batches") else batch
data = {k: v for k, v in batch.policy_batches["default_policy"].items()}
n = len(next(iter(data.values())))
params = [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def gradient(rows: slice, bf16: bool) -> dict[str, torch.Tensor]:
    """PPO's loss gradient on ``rows`` of the batch, forward and loss in bf16 or float32."""
    part = {"default_policy": {k: v[rows] for k, v in data.items()}}
    for _, p in params:
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        fwd = learner.module.forward_train(part)
        losses = learner.compute_losses(fwd_out=fwd, batch=part)
    losses["default_policy"].float().backward()
    return {name: p.grad.detach().float().clone() for name, p in params}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    va = torch.cat([g.flatten() for g in a.values()]).double()
    vb = torch.cat([g.flatten() for g in b.values()]).double()
    return {
        "cosine": float(torch.nn.functional.cosine_similarity(va, vb, dim=0)),
        "rel_norm_diff": float((va - vb).norm() / va.norm()),
        "norm_ratio": float(vb.norm() / va.norm()),
    }


full = slice(0, n)
fp32 = gradient(full, bf16=False)
bf16 = gradient(full, bf16=True)
halves = (gradient(slice(0, n // 2), False), gradient(slice(n // 2, n), False))
per_layer = {}
for name, _ in params:
    c = compare({name: fp32[name]}, {name: bf16[name]})
    per_layer[name] = {
        "cosine": round(c["cosine"], 6),
        "rel_norm_diff": round(c["rel_norm_diff"], 6),
    }
res = {
    "checkpoint": ckpt,
    "n": n,
    "fp32_grad_norm": float(torch.cat([g.flatten() for g in fp32.values()]).norm()),
    "bf16_vs_fp32": compare(fp32, bf16),
    "half_vs_half_fp32": compare(*halves),
    "worst_layer_cosine": min(v["cosine"] for v in per_layer.values()),
    "per_layer": per_layer,
}
print(json.dumps(res))
algo.stop()
