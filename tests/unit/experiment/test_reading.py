"""The experiment loader against files written to hurt it: every refusal is one clear line."""

from __future__ import annotations

import codecs
import os
import signal
import tracemalloc

import pytest

from rllib_amp import experiment as E
from rllib_amp.experiment import reading

GOOD_HEAD = "algorithm: PPO\nenv: CartPole-v1\nstop: {training_iteration: 1}\n"


@pytest.fixture(autouse=True)
def _no_hang():
    """A loader that loops forever fails the test instead of hanging the run."""

    def fail(signum, frame):
        raise AssertionError("the loader did not return within 20 s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def write(tmp_path, data: bytes | str, name="exp.yaml") -> str:
    p = tmp_path / name
    p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(p)


def refusal(path: str) -> str:
    with pytest.raises(E.ExperimentError) as e:
        E.load(path)
    msg = str(e.value)
    assert msg.startswith(path + ": "), msg
    assert "\n" not in msg, msg
    return msg


def test_duplicate_keys_name_the_key_and_both_lines(tmp_path):
    path = write(tmp_path, GOOD_HEAD + "training:\n  lr: 0.1\n  gamma: 0.9\n  lr: 0.2\n")
    msg = refusal(path)
    assert "line 7: duplicate key 'lr': first at line 5, again at line 7" in msg
    assert "keep one of them" in msg


def test_duplicate_top_level_key_is_refused_not_last_wins(tmp_path):
    msg = refusal(write(tmp_path, GOOD_HEAD + "algorithm: DQN\n"))
    assert "duplicate key 'algorithm': first at line 1, again at line 4" in msg


def test_keys_python_would_merge_are_duplicates_too(tmp_path):
    # 1 and true are the same dict key in Python: one value would vanish.
    msg = refusal(write(tmp_path, GOOD_HEAD + "env_config: {1: a, true: b}\n"))
    assert "duplicate key 'true' (as '1')" in msg


def test_merge_keys_may_be_overridden(tmp_path):
    text = GOOD_HEAD + "training:\n  <<: &t {lr: 0.1, gamma: 0.9}\n  lr: 0.2\n"
    assert E.load(write(tmp_path, text)).get("training.lr") == 0.2


@pytest.mark.parametrize(
    "text",
    ["env_config: &a {x: *a}\n", "env_config: {x: &a [1, *a]}\n", "env_config: &a {<<: *a}\n"],
    ids=["mapping", "sequence", "merge"],
)
def test_a_recursive_alias_is_an_error_not_a_loop(tmp_path, text):
    msg = refusal(write(tmp_path, GOOD_HEAD + text))
    assert "line 4" in msg and "recursive alias" in msg


def test_plain_aliases_still_work(tmp_path):
    text = GOOD_HEAD + "env_config: {max_episode_steps: &n 50}\nseed: *n\n"
    assert E.load(write(tmp_path, text)).get("seed") == 50


def billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_with_little_memory(tmp_path):
    text = billion_laughs()
    assert len(text) < 600  # the 0.5 KB file of the report: 9**9 strings once expanded
    path = write(tmp_path, text)
    tracemalloc.start()
    try:
        msg = refusal(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"beyond {reading.MAX_EXPANDED_NODES:,} values" in msg
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize(
    "text", ["[" * 5000 + "]" * 5000, "{a: " * 2000 + "1" + "}" * 2000], ids=["lists", "maps"]
)
def test_deep_nesting_is_refused_before_the_stack_runs_out(tmp_path, text):
    msg = refusal(write(tmp_path, GOOD_HEAD + "env_config: " + text + "\n"))
    assert f"nesting deeper than {reading.MAX_DEPTH} levels" in msg


NOT_TEXT = [
    ("latin-1", (GOOD_HEAD + "env_config: {name: Café}\n").encode("latin-1"), "line 4: byte 0xe9"),
    ("utf-16", (GOOD_HEAD).encode("utf-16"), "the file is UTF-16, not UTF-8"),
    ("utf-32", codecs.BOM_UTF32_LE + GOOD_HEAD.encode("utf-32-le"), "the file is UTF-32"),
    ("nul", GOOD_HEAD.encode() + b"seed: 1\x00\n", "line 4: a NUL byte"),
    ("binary", bytes(range(256)) * 8, "a NUL byte: this is not a text file"),
    ("bell", GOOD_HEAD.encode() + b"env: a\x07\n", "line 4, column 7: control character U+0007"),
]


@pytest.mark.parametrize("name, data, fragment", NOT_TEXT, ids=[n[0] for n in NOT_TEXT])
def test_files_that_are_not_utf8_text_get_a_clear_error(tmp_path, name, data, fragment):
    msg = refusal(write(tmp_path, data))
    assert fragment in msg, msg
    assert "UTF-8" in msg or "text" in msg or "remove it" in msg


def test_a_utf8_bom_is_fine(tmp_path):
    assert E.load(write(tmp_path, "\ufeff" + GOOD_HEAD)).algorithm == "PPO"


NUMBERS = [
    ("float", "training: {lr: 1e400}", "the number 1e400 is beyond float64"),
    ("negative float", "training: {lr: -1.5e309}", "the number -1.5e309 is beyond float64"),
    ("underflow", "training: {lr: 1e-400}", "below float64's smallest"),
    ("int 400 digits", "amp: {init_scale: " + "9" * 400 + "}", "(400 characters) is beyond"),
    ("int 5000 digits", "amp: {init_scale: " + "7" * 5000 + "}", "(5000 characters) is beyond"),
    ("int 310 digits", "training: {lr: 2" + "0" * 309 + "}", "is beyond float64"),
    ("hex", "seed: 0x" + "f" * 300, "is beyond float64"),
    ("sexagesimal", "seed: 1" + ":59" * 200, "is beyond float64"),
]


@pytest.mark.parametrize("name, line, fragment", NUMBERS, ids=[n[0] for n in NUMBERS])
def test_numbers_outside_float64_are_errors(tmp_path, name, line, fragment):
    msg = refusal(write(tmp_path, GOOD_HEAD + line + "\n"))
    assert "line 4: " in msg and fragment in msg, msg
    assert "use a value float64 can hold" in msg or "write 0" in msg


def test_numbers_float64_holds_still_load(tmp_path):
    text = GOOD_HEAD + "training: {lr: 1e-310, gamma: 0.99}\nenv_config: {x: 1.7e308, y: .inf}\n"
    exp = E.load(write(tmp_path, text))
    assert exp.get("training.lr") == 1e-310 and exp.get("env_config.x") == 1.7e308


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("!!int ''", "int value '' is not an integer"),
        ("!!int abc", "int value 'abc' is not an integer"),
        ("!!float abc", "float value 'abc' is not a number"),
        ("!!bool maybe", "bool value 'maybe' is not true or false"),
        ("!!timestamp never", "timestamp value 'never' is not a date"),
    ],
)
def test_explicit_tags_with_bad_text_are_errors_not_crashes(tmp_path, value, fragment):
    msg = refusal(write(tmp_path, GOOD_HEAD + f"seed: {value}\n"))
    assert fragment in msg and "line 4" in msg


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("seed: !!python/object:os.system x\n", "could not determine a constructor"),
        ("? [a, b]\n: 1\n", "found unhashable key"),
        ("seed: *nope\n", "found undefined alias 'nope'"),
        ("---\nseed: 1\n", "keep one document per file"),
    ],
)
def test_yaml_errors_that_are_not_syntax_say_what_to_use_instead(tmp_path, text, fragment):
    msg = refusal(write(tmp_path, GOOD_HEAD + text))
    assert fragment in msg and "YAML error at line" in msg


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda tmp: str(tmp), "is a folder"),
        (lambda tmp: os.devnull, "not a regular file"),
        (lambda tmp: write(tmp, "#" * (reading.MAX_FILE_BYTES + 10)), "an experiment file is"),
    ],
    ids=["folder", "device", "huge"],
)
def test_paths_that_are_not_an_experiment_file(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(E.ExperimentError, match=fragment) as e:
        E.load(path)
    assert str(e.value).startswith(path + ":")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(E.ExperimentError, match="not a regular file"):
        E.load(str(fifo))


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("training.lr=1e400", "the number 1e400 is beyond float64"),
        ("env_config={a: 1, a: 2}", "duplicate key 'a'"),
        ("env_config=&a {x: *a}", "recursive alias"),
        ("seed=" + "9" * 5000, "(5000 characters) is beyond float64"),
    ],
)
def test_set_values_get_the_same_loader(item, fragment):
    with pytest.raises(E.ExperimentError) as e:
        E.parse_override(item)
    assert str(e.value).startswith("--set ") and fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_load_overrides_given_a_string_is_a_type_error_saying_pass_a_list(tmp_path):
    path = write(tmp_path, GOOD_HEAD)
    with pytest.raises(TypeError, match=r"pass a list, e\.g\. overrides=\['amp.init_scale=8'\]"):
        E.load(path, overrides="amp.init_scale=8")
    with pytest.raises(TypeError, match="pass a list"):
        E.load(path, overrides=b"seed=1")
    with pytest.raises(TypeError, match="expected strings like"):
        E.load(path, overrides=[("seed", 1)])
    assert E.load(path, overrides=["amp.init_scale=8"]).get("amp.init_scale") == 8
