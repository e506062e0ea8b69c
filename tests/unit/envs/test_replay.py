"""GrowingEpisodeReplayBuffer: RLlib's EpisodeReplayBuffer, chunks appended in place."""

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

from rllib_amp.envs.replay import GrowingEpisodeReplayBuffer

# As DQN.training_step samples, with the extra model outputs in.
KW = {"include_extra_model_outputs": True}
FRAMES = np.random.default_rng(0).integers(0, 255, (200, 4, 6, 6), dtype=np.uint8)


def chunk(id_, t, n, terminated=False):
    """Steps t..t+n of a game whose frames are FRAMES (offset by the id), numpy'ized as an
    EnvRunner returns them."""
    off = 100 * (id_ == "b")
    return SingleAgentEpisode(
        id_=id_,
        observations=list(FRAMES[off + t : off + t + n + 1]),
        actions=list(np.arange(t, t + n) % 6),
        rewards=list(np.arange(t, t + n, dtype=np.float32)),
        extra_model_outputs={"q": list(np.arange(t, t + n, dtype=np.float32) / 10)},
        terminated=terminated,
        t_started=t,
        len_lookback_buffer=0,
    ).to_numpy()


def fill(buffer):
    """Two interleaved games in chunks of 4, as one EnvRunner of 2 envs returns them; "a"
    ends at step 24, "b" stays unfinished; one whole finished game "c" too."""
    sent = []
    for t in range(0, 40, 4):
        batch = [chunk("b", t, 4)]
        if t < 24:
            batch.append(chunk("a", t, 4, terminated=t + 4 == 24))
        if t == 8:
            batch.append(chunk("c", 0, 12, terminated=True))
        buffer.add(batch)
        sent += batch
    return sent


def test_it_stores_and_samples_exactly_what_rllibs_buffer_does():
    ours, rllibs = GrowingEpisodeReplayBuffer(capacity=1000), EpisodeReplayBuffer(capacity=1000)
    sent = fill(ours)
    fill(rllibs)
    assert ours.get_num_timesteps() == rllibs.get_num_timesteps() == 24 + 40 + 12
    for mine, theirs in zip(ours.episodes, rllibs.episodes, strict=True):
        assert (mine.id_, len(mine), mine.is_terminated) == (
            theirs.id_,
            len(theirs),
            theirs.is_terminated,
        )
        for get in ("get_observations", "get_actions", "get_rewards"):
            np.testing.assert_array_equal(np.asarray(getattr(mine, get)()), getattr(theirs, get)())
        np.testing.assert_array_equal(
            np.asarray(mine.get_extra_model_outputs("q")), theirs.get_extra_model_outputs("q")
        )
    ours.rng, rllibs.rng = np.random.default_rng(3), np.random.default_rng(3)
    a = ours.sample(num_items=64, n_step=3, gamma=0.9, batch_length_T=0, sample_episodes=True, **KW)
    b = rllibs.sample(
        num_items=64, n_step=3, gamma=0.9, batch_length_T=0, sample_episodes=True, **KW
    )
    assert len(a) == len(b) == 64
    for x, y in zip(a, b, strict=True):
        assert (x.id_, x.t_started, x.is_terminated) == (y.id_, y.t_started, y.is_terminated)
        np.testing.assert_array_equal(np.asarray(x.get_observations()), y.get_observations())
        np.testing.assert_allclose(np.asarray(x.get_rewards()), y.get_rewards())  # n-step sums
        assert x.get_extra_model_outputs("n_step")[0] == y.get_extra_model_outputs("n_step")[0]
    # The EnvRunner's episodes (it keeps them for its metrics) are left as they came.
    assert all(e.is_numpy and isinstance(e.observations.data, np.ndarray) for e in sent)


def test_a_new_chunk_appends_to_the_stored_episode_in_place():
    """RLlib's buffer replaces the stored arrays by a copy of the whole episode per chunk
    (quadratic in its length); ours grows one list by the chunk's own steps."""
    ours, rllibs = GrowingEpisodeReplayBuffer(capacity=1000), EpisodeReplayBuffer(capacity=1000)
    for buffer in (ours, rllibs):
        buffer.add(chunk("b", 0, 4))
    mine, theirs = ours.episodes[0].observations.data, rllibs.episodes[0].observations.data
    frame = mine[2]
    for buffer in (ours, rllibs):
        buffer.add(chunk("b", 4, 4))
    assert ours.episodes[0].observations.data is mine and mine[2] is frame and len(mine) == 9
    assert rllibs.episodes[0].observations.data is not theirs  # the copy this buffer avoids
    # A finished game that arrives whole is stored as numpy, as RLlib stores it.
    ours.add(chunk("c", 0, 4, terminated=True))
    assert isinstance(ours.episodes[1].observations.data, np.ndarray)
