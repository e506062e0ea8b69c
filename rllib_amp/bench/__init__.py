"""``python -m rllib_amp.bench``: what AMP buys over stock RLlib, side by side in one run.

Variants (all in the same invocation, interleaved, several repetitions, medians):
  fp32          stock RLlib, float32
  rllib-scaler  stock RLlib with its built-in config.experimental(_torch_grad_scaler_class=...)
  amp-auto      rllib-amp, precision auto
  amp-fp16      rllib-amp, float16 + GradScaler (GPU only)
  amp-bf16      rllib-amp, bfloat16 (GPU only)

Figures (``figures``), on the workloads of ``workloads.WORKLOADS``:
  1. learner update throughput (samples/s) on one fixed batch per algorithm (PPO with the
     learner connector's GAE pass, DQN), ALE/Pong-v5 observations, presets mini / full / high;
  2. peak memory of the update (CUDA: max_memory_allocated; CPU: peak resident memory of a
     child process per variant, above its resident memory before the update, with glibc's
     allocator defaults);
  3. end-to-end env steps/s of PPO on ALE/Pong-v5, 16 envs per EnvRunner;
  4. (with PPO) the learner's fixed cost per minibatch step (``fixed_cost``: a tiny network,
     in ms per step, on one torch thread; alone: ``python -m rllib_amp.bench.fixed_cost_run``);
  5. (not with --quick) learning parity: CartPole-v1 PPO and DQN, 3 seeds, return after a
     fixed number of env steps.

Figures 1-3 sample Pong on the default Atari path (ALE's native env, uint8 observations).

Atari-path figures (``atari_figures``), RLlib's Python wrappers (float32 observations) vs ALE's
native vector env (uint8), variants ``workloads.PATH_VARIANTS`` ("fp32 wrappers" is stock
RLlib as it ships and the reference of their ratios):
  6. sampling env steps/s of one EnvRunner with 16 envs, inference included, each repetition
     of each path in a fresh process;
  7. end-to-end env steps/s of PPO and APPO (both with targets) on Pong;
  8. DQN replay-buffer bytes per stored transition (with --algos including DQN);
  9. peak memory of a learner update per path variant.
The Atari path's targets (``report.TARGETS``) print under the table as measured ratios, met or not.

Each throughput cell and the end-to-end figure run in a fresh process (``harness``), and
within it every variant runs interleaved, so the variants share one process: rllib-amp's CPU
allocator setting (rllib_amp.learner.malloc) applies to the stock variants as well. The speed
figures run unseeded: a seed makes RLlib switch on torch's deterministic mode on a CPU,
which is not how one trains for speed. ``report`` prints the table and writes the files.
The modules load torch and RLlib; this package's root imports none of them.

Example:
    python -m rllib_amp.bench --quick --json bench.json
"""
