"""``python -m rllib_amp.bench``: see rllib_amp.bench.command."""

import sys

from rllib_amp.cli import local_ray_on_loopback

local_ray_on_loopback(sys.argv[1:])  # the benchmark's Ray is its own: on 127.0.0.1

from rllib_amp.bench.command import main  # noqa: E402

raise SystemExit(main())
