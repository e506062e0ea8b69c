"""Research studies built on rllib-amp, kept out of the installed package: run them from the
repository root (``python -m studies.learning``, ``python -m studies.scaler_study``)."""
