"""``python -m rllib_amp.params``: each model preset's parameter count (``rllib_amp.envs.params``)."""

import sys

from rllib_amp.envs.params import main

if __name__ == "__main__":
    sys.exit(main())
