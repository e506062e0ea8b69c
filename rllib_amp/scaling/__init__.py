"""Pure torch, no Ray: the per-policy loss scaler, the set of them inside a learner's
gradient path, their checkpoint state and warm starts."""
