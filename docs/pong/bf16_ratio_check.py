"""How far bfloat16 autocast moves PPO's log-probs of the taken actions away from the float32
log-probs the EnvRunner sampled with: the probability ratio's error before any update.

    python docs/pong/bf16_ratio_check.py \
        results/pong_2026-12-01/checkpoints/amp-native-seed0/iter_002918

Restores a Pong run's checkpoint (``studies.learning``'s amp-native config), samples 2,048 env
steps with its policy, runs the module's training forward pass in float32 and under bfloat16
autocast, and prints the differences as one JSON line (docs/pong/bf16_ratio_check.json holds
the 2026-12-02 output). See docs/pong.md.
"""

import json
import sys

import numpy as np
import torch

from studies import learning as P

ckpt = sys.argv[1] if len(sys.argv) > 1 else None
algo = P.build_config("amp-native", 0, 3_000_000, "cpu", None).build_algo()
if ckpt:
    algo.restore_from_path(ckpt)
eps = algo.env_runner.sample(num_timesteps=2048, random_actions=False)
obs = np.concatenate([np.asarray(e.get_observations(slice(0, len(e)))) for e in eps])
act = np.concatenate([np.asarray(e.get_actions()) for e in eps])
module = algo.learner_group._learner.module["default_policy"]
x = torch.as_tensor(obs)
a = torch.as_tensor(act).long()
out = {}
with torch.no_grad():
    for name, ctx in [
        ("fp32", torch.autocast("cpu", enabled=False)),
        ("bf16", torch.autocast("cpu", dtype=torch.bfloat16)),
    ]:
        with ctx:
            fwd = module.forward_train({"obs": x})
        logits = fwd["action_dist_inputs"].float()
        out[name] = torch.log_softmax(logits, -1).gather(1, a[:, None])[:, 0]
        out[name + "_logits"] = logits
d = (out["bf16"] - out["fp32"]).abs()
ratio = torch.exp(out["bf16"] - out["fp32"])
res = {
    "checkpoint": ckpt,
    "n": int(len(a)),
    "logit_abs_mean": float(out["fp32_logits"].abs().mean()),
    "dlogp_mean": float(d.mean()),
    "dlogp_p99": float(d.quantile(0.99)),
    "ratio_minus_1_abs_mean": float((ratio - 1).abs().mean()),
    "share_outside_clip_0.1": float(((ratio - 1).abs() > 0.1).float().mean()),
    "share_outside_0.01": float(((ratio - 1).abs() > 0.01).float().mean()),
}
print(json.dumps(res))
algo.stop()
