"""Checkpoints: verified files (manifest, finite values), all-or-nothing algorithm
restores, and the resume fallback past a damaged checkpoint."""
