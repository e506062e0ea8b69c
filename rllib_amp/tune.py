"""``python -m rllib_amp.tune``: the sweep command (the code lives in ``rllib_amp.sweep``)."""

import sys

from rllib_amp.sweep.main import main

if __name__ == "__main__":
    sys.exit(main())
