"""The bench's Atari-path figures (RLlib's wrappers vs ALE's native env and uint8): their
configs, tiny real measurements, the rows, and the targets as ratios of measured numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rllib_amp.bench import atari_figures, command, report, workloads
from rllib_amp.bench.atari_figures import NATIVE_AMP
from rllib_amp.bench.atari_figures import RAW_ALE as RAW
from rllib_amp.bench.workloads import PATH_VARIANTS, STOCK
from rllib_amp.envs.atari import NATIVE, WRAPPERS


@pytest.fixture(autouse=True, scope="module")
def _leave_no_ray_behind():
    """Building an algorithm in this process starts Ray; stop the one these tests started, so
    later test files that check the CLI never starts Ray see none running."""
    import ray

    already = ray.is_initialized()
    yield
    if not already and ray.is_initialized():
        ray.shutdown()


def test_sampling_runs_each_path_per_rep_interleaved_and_keeps_every_measurement():
    calls = []
    paths = [WRAPPERS, NATIVE, NATIVE_AMP, RAW]

    def fake(path, num_envs, env_steps, model):
        calls.append(path)
        return {WRAPPERS: 100.0, NATIVE: 350.0, NATIVE_AMP: 700.0, RAW: 1000.0}[path] + len(calls)

    out = atari_figures.bench_sampling(3, env_steps=64, model="mini", measure=fake)
    assert calls[:4] == paths and sorted(calls) == sorted(3 * paths)
    assert out[NATIVE] == [350.0 + 1 + i for i, c in enumerate(calls) if c == NATIVE]
    (row_w, row_n, row_amp, row_raw) = report.rows_from({"sampling": out})
    assert row_w["variant"] == WRAPPERS and row_w["ratio_to_fp32"] == 1.0
    native, amp, wrappers, raw = (sorted(out[k])[1] for k in (NATIVE, NATIVE_AMP, WRAPPERS, RAW))
    assert row_n["ratio_to_fp32"] == pytest.approx(native / wrappers)
    # Every env-steps/s row carries its share of the raw ALE limit measured in the same run.
    assert row_n["of_raw_ale"] == pytest.approx(native / raw) and row_raw["of_raw_ale"] == 1.0
    assert row_amp["of_raw_ale"] == pytest.approx(amp / raw)
    table = report.markdown(report.rows_from({"sampling": out}), "#")
    assert "of raw ALE" in table and f"{100 * native / raw:.0f}%" in table
    (sampling, of_raw, amp_of_raw, *_) = report.targets({"sampling": out})
    assert sampling["ratio"] == pytest.approx(native / wrappers) and sampling["met"] is True
    assert of_raw["ratio"] == pytest.approx(native / raw) and of_raw["met"] is False
    assert amp_of_raw["ratio"] == pytest.approx(amp / raw) and amp_of_raw["met"] is True


def test_each_sampling_path_runs_its_own_named_job_in_a_child(monkeypatch):
    from rllib_amp.bench import sampling

    jobs = []

    def child(fn, *args):
        jobs.append((fn.__name__, args))  # in_child names the job in its errors
        return (1.0, 1.0)

    monkeypatch.setattr(atari_figures, "in_child", child)
    atari_figures.bench_sampling(1, env_steps=64, model="mini")
    assert jobs == [
        ("sampling_one", (WRAPPERS, 16, 64, "mini")),
        ("sampling_one", (NATIVE, 16, 64, "mini")),
        ("sampling_amp_inference", (16, 64, "mini")),
        ("raw_ale_one", (16, 64)),
    ]
    assert sampling.sampling_amp_inference.__module__ == "rllib_amp.bench.sampling"


def test_the_raw_ale_limit_is_measured_for_real():
    from rllib_amp.bench.sampling import raw_ale_one

    per_s, per_cpu_s = raw_ale_one(num_envs=4, env_steps=64, num_cpus=1)
    assert per_s > 0 and per_cpu_s > 0


def _results(
    sampling=(1.0, 3.5, 4.0, 5.0),
    e2e=(10.0, 24.0),
    appo=(5.0, 9.5, 10.0),
    fixed=(2.0e-3, 1.9e-3),
    replay=(4.0, 1.0),
    memory=(100.0, 90.0),
):
    return {
        "sampling": {
            WRAPPERS: [sampling[0]],
            NATIVE: [sampling[1]],
            NATIVE_AMP: [sampling[2]],
            RAW: [sampling[3]],
        },  # fmt: skip
        # Fixed cost: seconds per minibatch step, one raw record and one bare number each.
        "fixed_cost": {
            "fp32": [{"per_step_s": fixed[0]}, fixed[0]],
            "amp-auto": [{"per_step_s": fixed[1]}, fixed[1]],
        },
        "end_to_end_paths": {
            "PPO": {STOCK: [e2e[0], e2e[0]], "fp32 native": [15.0], "amp native": [e2e[1]]},
            "APPO": {STOCK: [appo[0]], "fp32 native": [appo[2]], "amp native": [appo[1]]},
        },
        "replay_bytes": {
            STOCK: {"all": replay[0], "observations": replay[0]},
            "fp32 native": {"all": replay[1], "observations": replay[1]},
        },
        "memory_paths": {
            "PPO full": {STOCK: 200.0, "amp wrappers": memory[0], "amp native": memory[1]}
        },
    }


def test_targets_are_ratios_of_the_measured_numbers_with_met_or_not():
    met = {t["target"]: t for t in report.targets(_results())}
    ratios = [t["ratio"] for t in met.values()]
    assert ratios == pytest.approx([3.5, 0.7, 0.8, 2.4, 1.9, 1.6, 0.95, 0.95, 0.25, 0.9])
    assert [t["met"] for t in met.values()] == [True] * 3 + [False, False, True, False] + [True] * 3
    # Bounds: >= 3, >= 0.6 (float32 and amp inference), >= 2.5, >= 2, AMP >= float32 on each
    # native path (equal is not slower), <= 1 (an equal fixed cost is "no higher"), <= 1/3.5,
    # < 1 (equal memory is not "below").
    edge = report.targets(
        _results(
            sampling=(1.0, 3.0, 3.0, 5.0),
            appo=(5.0, 10.0, 10.0),
            fixed=(2e-3, 2e-3),
            replay=(3.5, 1.0),
            memory=(90.0, 90.0),
        )
    )
    assert [t["met"] for t in edge] == [True] * 3 + [False] + [True] * 5 + [False]
    higher = report.targets(_results(fixed=(2e-3, 2.1e-3)))
    assert [t["met"] for t in higher][7] is False
    table = report.markdown_targets(report.targets(_results()))
    assert table.count("NOT MET") == 3 and "2.400" in table and "1.900" in table


@pytest.mark.parametrize(("amp_ms", "met"), [(3.4, True), (4.0, True), (4.25, True), (4.5, False)])
def test_the_fixed_cost_is_met_within_stock_s_spread_and_not_beyond_it(amp_ms, met):
    # Stock's repetitions 2, 3, 4, 5 ms: median 3.5, upper quartile 4.25. An AMP median above
    # stock's but inside its spread is not told apart from it by the run; above it, is slower.
    results = {"fixed_cost": {"fp32": [2e-3, 3e-3, 4e-3, 5e-3], "amp-auto": [amp_ms / 1000]}}
    (row,) = [t for t in report.targets(results) if t["target"].startswith("fixed cost")]
    assert row["ratio"] == pytest.approx(amp_ms / 3.5) and row["met"] is met
    assert "within the spread" in row["required"]


def test_only_a_no_higher_than_target_may_be_met_within_its_spread():
    assert all(t.op == "<=" for t in report.TARGETS.values() if t.within_spread)
    # The table says when the spread, not the medians, met it.
    results = {"fixed_cost": {"fp32": [2e-3, 3e-3, 4e-3, 5e-3], "amp-auto": [4e-3]}}
    table = report.markdown_targets(report.targets(results))
    assert "met within the spread (NOT MET by the medians)" in table


def test_targets_without_their_figure_are_not_measured_not_failed():
    out = report.targets({"sampling": {WRAPPERS: [2.0], NATIVE: [7.0]}})
    assert out[0]["met"] is True and out[0]["ratio"] == pytest.approx(3.5)
    assert [t["met"] for t in out[1:]] == [None] * 9
    assert all(math.isnan(t["ratio"]) for t in out[1:])
    assert report.markdown_targets(out).count("not measured") == 9


def test_rows_of_the_atari_figures_take_stock_wrappers_as_reference():
    rows = report.rows_from(_results())
    by = {(r["figure"], r["workload"], r["variant"]): r for r in rows}
    ppo = by[("end to end, Atari paths", "PPO ALE/Pong-v5 full", "amp native")]
    assert ppo["reference"] == STOCK and ppo["ratio_to_fp32"] == pytest.approx(2.4)
    appo = by[("end to end, Atari paths", "APPO ALE/Pong-v5 full", "amp native")]
    assert appo["ratio_to_fp32"] == pytest.approx(1.9)
    replay = by[("DQN replay bytes per transition", "ALE/Pong-v5, all", "fp32 native")]
    assert replay["ratio_to_fp32"] == pytest.approx(0.25) and replay["better_is"] == "lower"
    mem = by[("peak memory of update, Atari paths", "PPO full", "amp native")]
    assert mem["value"] == pytest.approx(90.0 / 2**20) and mem["ratio_to_fp32"] == 0.45
    assert report.markdown(rows, "h").count("\n") == len(rows) + 3


def test_path_variants_build_the_configs_they_name():
    from rllib_amp.algorithms import algorithm
    from rllib_amp.envs.atari import AleVectorEnv
    from rllib_amp.envs.configure import AtariEnv

    record = algorithm("PPO")
    cfgs = atari_figures.path_configs("PPO", list(PATH_VARIANTS), "cpu", model="mini", num_envs=2)
    assert cfgs[STOCK].env is AtariEnv and cfgs[STOCK].learner_class is record.learner
    assert cfgs["amp wrappers"].env is AtariEnv
    assert cfgs["amp wrappers"].learner_class is record.amp_learner
    assert cfgs["fp32 native"].env is AleVectorEnv
    assert cfgs["fp32 native"].learner_class is record.learner
    assert cfgs["amp native"].env is AleVectorEnv
    assert cfgs["amp native"].learner_class is record.amp_learner
    assert all(c.num_envs_per_env_runner == 2 for c in cfgs.values())
    appo = atari_figures.path_configs("APPO", [STOCK], "cpu", model="mini")
    assert appo[STOCK].train_batch_size_per_learner == 1024
    # Local learners: APPO's default remote one (1 CPU each) would leave the third waiting.
    assert appo[STOCK].num_learners == 0 and cfgs[STOCK].num_learners == 0


def test_memory_paths_give_each_label_its_variant_and_its_paths_batch(monkeypatch):
    seen = []

    def fake(fn, algo, model, variant, device, data_path, preprocessing):
        assert fn is atari_figures.memory_one
        seen.append((variant, data_path, preprocessing))
        return len(seen) * 1.0

    monkeypatch.setattr(atari_figures, "in_child", fake)
    data = {WRAPPERS: "w.pkl", NATIVE: "n.pkl"}
    out = atari_figures.bench_memory_paths("PPO", "mini", list(PATH_VARIANTS), "cpu", data)
    assert out == {STOCK: 1.0, "amp wrappers": 2.0, "fp32 native": 3.0, "amp native": 4.0}
    assert seen == [
        ("fp32", "w.pkl", WRAPPERS),
        ("amp-auto", "w.pkl", WRAPPERS),
        ("fp32", "n.pkl", NATIVE),
        ("amp-auto", "n.pkl", NATIVE),
    ]
    with pytest.raises(ValueError, match="APPO"):
        atari_figures.bench_memory_paths("APPO", "mini", [STOCK], "cpu", data)


def test_numpy_bytes_counts_each_array_once():
    a = np.zeros((3, 4), np.float32)
    assert atari_figures.numpy_bytes([a, {"b": a}, (a,)]) == 48
    assert atari_figures.numpy_bytes({"x": np.zeros(5, np.uint8), "y": "text"}) == 5


def test_replay_buffer_holds_a_quarter_of_the_bytes_on_the_native_path():
    """Real buffers, a few steps: the DQN config's replay buffer on each path."""
    wrappers = atari_figures.replay_bytes_one(WRAPPERS, 64, num_envs=2)
    native = atari_figures.replay_bytes_one(NATIVE, 64, num_envs=2)
    for out in (wrappers, native):
        assert out["transitions"] >= 64
        assert out["observations"] <= out["all"]
    frame = 84 * 84 * 4
    # Each episode also holds its last observation: a little over one per transition.
    assert 4 * frame <= wrappers["observations"] < 4 * frame * 1.2
    assert frame <= native["observations"] < frame * 1.2
    assert native["all"] / wrappers["all"] <= 1 / 3.5


def test_sampling_one_measures_a_real_runner():
    from rllib_amp.bench.sampling import sampling_one

    wall, per_cpu_s = sampling_one(NATIVE, 2, 64, "mini")
    assert wall > 0 and per_cpu_s > 0


def test_the_amp_sampling_row_samples_with_with_amp_s_inference(monkeypatch):
    import rllib_amp
    from rllib_amp.bench.sampling import sampling_one

    asked = []
    real = rllib_amp.with_amp

    def spy(config, **kwargs):
        asked.append(kwargs)
        return real(config, **kwargs)

    monkeypatch.setattr(rllib_amp, "with_amp", spy)
    wall, _ = sampling_one(NATIVE, 2, 64, "mini", inference_dtype="bfloat16")
    assert wall > 0 and asked == [{"inference_dtype": "bfloat16"}]
    sampling_one(NATIVE, 2, 64, "mini")  # float32, as stock: no with_amp
    assert len(asked) == 1


@pytest.mark.slow  # slow (12 s)
def test_end_to_end_paths_train_every_label_on_tiny_settings():
    training = {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}
    labels = [STOCK, "amp native"]
    out, learner = atari_figures.bench_end_to_end_paths(
        "PPO", labels, "cpu", 1, model="mini", num_envs=2, training=training, warmup=0
    )
    assert list(out) == labels and all(len(v) == 1 and v[0] > 0 for v in out.values())
    # The learner's share of the same iteration: some, and less than all of it.
    for label in labels:
        assert 0 < learner[label][0] < 1 / out[label][0]


def test_command_runs_every_atari_figure_and_keys_them_for_the_targets(monkeypatch):
    calls = []
    monkeypatch.setattr(command, "collect_data", lambda *a, **k: calls.append(("data", k)))
    monkeypatch.setattr(command, "in_child", lambda fn, *a: ({"rates": a[0]}, {"learner": a[0]}))
    monkeypatch.setattr(command.atari_figures, "bench_sampling", lambda reps, **k: {"r": reps})
    monkeypatch.setattr(command.atari_figures, "bench_replay_bytes", lambda n: {"n": n})
    monkeypatch.setattr(
        command.atari_figures, "bench_memory_paths", lambda algo, *a: {"labels": a[1]}
    )
    out = command.atari_paths(["PPO", "DQN"], "cpu", 3, quick=True)
    assert out["sampling"] == {"r": 3} and out["replay_bytes"] == {"n": 1024}
    assert sorted(out["end_to_end_paths"]) == ["APPO", "PPO"]
    assert out["end_to_end_paths"]["APPO"] == {"rates": "APPO"}
    assert out["end_to_end_learner"]["PPO"] == {"learner": "PPO"}
    assert sorted(out["memory_paths"]) == ["DQN full", "PPO full"]
    assert out["memory_paths"]["PPO full"]["labels"] == list(workloads.PATH_VARIANTS)
    assert [k["preprocessing"] for _, k in calls] == [WRAPPERS, NATIVE] * 2
    assert "replay_bytes" not in command.atari_paths(["PPO"], "cpu", 1, quick=True)


def test_the_bounds_say_what_the_learners_time_leaves_for_end_to_end():
    # Raw ALE 4,000 env steps/s; PPO's learner 0.5 ms per env step leaves at most
    # 1/(1/4000 + 0.0005) = 1,333 env steps/s (3.33x a stock 400: 2.5x reachable), 0.75 ms at
    # most 1,000 (2.5x just reachable), 1 ms at most 800 (not).
    results = _results(sampling=(1.0, 3.5, 4.0, 4000.0))
    results["end_to_end_paths"]["PPO"][STOCK] = [400.0]
    results["end_to_end_learner"] = {
        "PPO": {STOCK: [0.002], "fp32 native": [0.001], "amp native": [0.0005]},
        "APPO": {"amp native": [0.00075]},
    }
    rows = {(r["algo"], r["path"]): r for r in report.end_to_end_bounds(results)}
    assert sorted(rows) == [("APPO", "amp native"), ("PPO", "amp native"), ("PPO", "fp32 native")]
    amp = rows[("PPO", "amp native")]
    assert amp["at_raw"] == pytest.approx(4000 / 3)
    assert amp["at_target"] == pytest.approx(1 / (1 / 2400 + 0.0005))
    assert amp["measured"] == 24.0 and amp["stock"] == 400.0 and amp["required"] == 2.5
    assert rows[("PPO", "fp32 native")]["at_raw"] == pytest.approx(800)
    assert rows[("APPO", "amp native")]["required"] == 2.0
    table = report.markdown_bounds(list(rows.values()))
    assert "1,333 (3.33x)" in table and "800 (2.00x)" in table
    assert table.count("no: the learner alone rules it out") == 1
    # Without raw ALE in the run there is no limit to measure against.
    assert report.end_to_end_bounds({**results, "sampling": {}}) == []


def test_a_finished_run_s_files_say_where_and_when_they_were_measured(tmp_path):
    import json

    import pyarrow.parquet as pq

    results = _results()
    del results["replay_bytes"]  # one target not measured
    results["end_to_end_learner"] = {"PPO": {"amp native": [0.0005]}}
    header = "rllib-amp benchmark, 2026-12-07, Some CPU, 2 cores (avx512_bf16); 9 s"
    rows = report.rows_from(results)
    report.write_outputs(rows, results, str(tmp_path / "b.json"), str(tmp_path / "out"), header)
    text = (tmp_path / "b.json").read_text()
    # Strict JSON: a target not measured is null, not NaN (which jq and browsers reject).
    saved = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert saved["header"] == header and len(saved["rows"]) == len(rows)
    assert [b["path"] for b in saved["bounds"]] == ["amp native"]
    assert any(t["ratio"] is None and t["met"] is None for t in saved["targets"])
    table = pq.read_table(tmp_path / "out" / report.PARQUET_NAME)
    assert table.schema.metadata[b"header"] == header.encode()
    assert table.num_rows == len(rows)
    # Every row's columns, not only the first row's: the env-steps/s rows' share of raw ALE.
    shares = dict(zip(table.column("variant").to_pylist(), table.column("of_raw_ale").to_pylist()))
    assert shares[RAW] == 1.0 and shares[WRAPPERS] == pytest.approx(1.0 / 5.0)
