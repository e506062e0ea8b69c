"""Environments and models: configure_env, ALE's native vector env, model presets."""
