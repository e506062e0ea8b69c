"""Checkpoints: all-or-nothing algorithm restores, and the resume fallback past a damaged
checkpoint. Both read every file first through ``rllib_amp.checkpoint_files`` (manifest,
finite values), which sits in the base layer so that warm starts check as much."""
