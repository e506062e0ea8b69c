"""RLlib's EpisodeReplayBuffer, with ongoing episodes that grow by their new steps only.

An EnvRunner returns an unfinished episode in numpy chunks; RLlib's buffer appends each later
chunk with ``concat_episode``, which on numpy buffers copies the whole episode so far twice
(quadratic in its length; docs/dqn.md has the cost on Pong). This buffer turns a new
unfinished chunk's buffers back into lists, which ``concat_episode`` appends to in place.
Sampling reads the same steps either way; finished episodes that arrive whole stay numpy.

Example:
    >>> from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    >>> def chunk(t):
    ...     return SingleAgentEpisode(id_="e", observations=[t, t + 1], actions=[t], rewards=[1.0],
    ...                               t_started=t, len_lookback_buffer=0).to_numpy()
    >>> buf = GrowingEpisodeReplayBuffer(capacity=10)
    >>> buf.add(chunk(0))
    >>> buf.add(chunk(1))
    >>> buf.get_num_timesteps(), [int(o) for o in buf.episodes[0].get_observations()]
    (2, [0, 1, 2])
"""

from __future__ import annotations

import copy

from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
from ray.rllib.utils.spaces.space_utils import unbatch


class GrowingEpisodeReplayBuffer(EpisodeReplayBuffer):
    """EpisodeReplayBuffer whose stored unfinished episodes are lists, so chunks append."""

    def add(  # type: ignore[override]  # EpisodeReplayBuffer.add's own signature
        self, episodes: list[SingleAgentEpisode] | SingleAgentEpisode
    ) -> None:
        super().add([_growable(e) for e in force_list(episodes)])


def _growable(episode: SingleAgentEpisode) -> SingleAgentEpisode:
    # An unfinished numpy episode becomes a copy with list buffers: the EnvRunner keeps the
    # input for its metrics, so it is never changed in place.
    if episode.is_done or not episode.is_numpy:
        return episode
    episode = copy.deepcopy(episode)
    for buffer in (
        episode.observations,
        episode.actions,
        episode.rewards,
        *episode.extra_model_outputs.values(),
    ):
        if buffer.finalized:
            buffer.data = unbatch(buffer.data)
            buffer.finalized = False
    return episode
