"""The RLlib adapter: the learner mixin and what it delegates to (precision, the value
pass, minibatches, fused Adam, the allocator, autocast EnvRunners, the per-update report)."""
