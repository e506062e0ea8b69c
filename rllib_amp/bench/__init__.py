"""``python -m rllib_amp.bench``: what AMP buys over stock RLlib, side by side in one run.

Variants (all in the same invocation, interleaved, several repetitions, medians):
  fp32          stock RLlib, float32
  rllib-scaler  stock RLlib with its built-in config.experimental(_torch_grad_scaler_class=...)
  amp-auto      rllib-amp, precision auto
  amp-fp16      rllib-amp, float16 + GradScaler (GPU only)
  amp-bf16      rllib-amp, bfloat16 (GPU only)

Figures (``figures``, on the workloads of ``workloads.WORKLOADS``, presets mini / full / high,
sampling Pong on the default Atari path): learner update throughput (samples/s) and its peak
memory, end-to-end PPO env steps/s on Pong (16 envs per EnvRunner), the learner's fixed cost
per minibatch step (``fixed_cost``; alone: ``python -m rllib_amp.bench.fixed_cost_run``), and
(not with --quick) learning parity: CartPole-v1 PPO and DQN, 3 seeds.

Atari-path figures (``atari_figures``), RLlib's Python wrappers (float32 observations) vs ALE's
native vector env (uint8), variants ``workloads.PATH_VARIANTS`` ("fp32 wrappers" is stock
RLlib as it ships and the reference of their ratios): sampling env steps/s of one EnvRunner,
end to end of PPO and APPO, DQN replay-buffer bytes per stored transition (with DQN in
--algos), and learner peak memory. Their targets (``report.TARGETS``) print under the table as
measured ratios, met or not. docs/benchmark.md describes every figure.

Each throughput cell and the end-to-end figure run in a fresh process (``harness``), and
within it every variant runs interleaved, so the variants share one process: rllib-amp's CPU
allocator setting (rllib_amp.learner.malloc) applies to the stock variants as well. The speed
figures run unseeded: a seed makes RLlib switch on torch's deterministic mode on a CPU,
which is not how one trains for speed. ``report`` prints the table and writes the files.
The modules load torch and RLlib; this package's root imports none of them.

Example:
    python -m rllib_amp.bench --quick --json bench.json
"""
