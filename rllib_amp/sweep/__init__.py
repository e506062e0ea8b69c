"""``python -m rllib_amp.tune``: arguments, Ray, Tune wiring, resume rules, storage,
resources, schedulers, the summary, the recommendation, loggers."""
