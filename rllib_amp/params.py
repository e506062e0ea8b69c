"""``python -m rllib_amp.params``: each model preset's parameter count (see envs/params.py)."""

import sys

from rllib_amp.envs.params import main

if __name__ == "__main__":
    sys.exit(main())
