#!/usr/bin/env bash
# What tests/cli/sweep/test_dashboard.py needs beyond the project's Python packages: a real
# Prometheus to scrape Ray's metrics and a headless Chromium for the dashboard's screenshot
# (Debian packages; run as root). Grafana is not packaged for Debian, so it is not checked.
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus chromium
