"""``python -m rllib_amp.bench``: what AMP buys over stock RLlib, side by side in one run.

Variants (all in the same invocation, interleaved, several repetitions, medians):
  fp32          stock RLlib, float32
  rllib-scaler  stock RLlib with its built-in config.experimental(_torch_grad_scaler_class=...)
  amp-auto      rllib-amp, precision auto
  amp-fp16      rllib-amp, float16 + GradScaler (GPU only)
  amp-bf16      rllib-amp, bfloat16 (GPU only)

The figures: ``figures`` (learner throughput and peak memory, PPO Pong end to end, learning
parity), ``fixed_cost`` (per minibatch step; alone: ``python -m rllib_amp.bench.fixed_cost_run``)
and ``atari_figures`` (RLlib's float32 Atari wrappers vs ALE's native uint8 env, variants
``workloads.PATH_VARIANTS``, with ``report.TARGETS`` under the table as measured ratios, met or
not); docs/benchmark.md describes every one. ``command`` runs them in order, ``report`` prints
the table and writes the files.

Each throughput cell and the end-to-end figure run in a fresh process (``harness``), every
variant interleaved within it, so rllib-amp's CPU allocator setting (rllib_amp.learner.malloc)
applies to the stock variants as well. The speed figures run unseeded: a seed makes RLlib switch
on torch's deterministic mode on a CPU, which is not how one trains for speed. The modules load
torch and RLlib; this package's root imports none of them.

Example:
    python -m rllib_amp.bench --quick --json bench.json
"""
