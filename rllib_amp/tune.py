"""``python -m rllib_amp.tune``: the sweep command (the code lives in ``rllib_amp.sweep``)."""

import sys

from rllib_amp.cli import interrupts_as_exit, local_ray_on_loopback, run_as_command

if __name__ == "__main__":
    local_ray_on_loopback(sys.argv[1:])  # before ray is imported
# Ctrl-C or SIGTERM while the command's modules load is one line and 130/143 too.
with interrupts_as_exit("python -m rllib_amp.tune"):
    from rllib_amp.sweep.main import main

if __name__ == "__main__":
    run_as_command()  # this process is the command: a dead local Ray may end it (LocalRayWatchdog)
    sys.exit(main())
