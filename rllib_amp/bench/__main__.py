"""``python -m rllib_amp.bench``: see rllib_amp.bench.command."""

from rllib_amp.bench.command import main

raise SystemExit(main())
