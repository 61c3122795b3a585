#!/usr/bin/env bash
# The main job: install what is missing, build, show the target, then run the seed model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/tools/tgc info
build/tools/tgc run models/seed.yaml
