#!/usr/bin/env bash
# Installs what tgc needs to build and test, from Debian's packages, when it is missing.
# The CUDA Toolkit is optional: without it (or with TGC_CUDA=OFF) tgc builds CPU-only.
#   scripts/setup.sh [--tests] [--fuzz]   (--tests: also what only the tests need, a headless
#                                 browser that draws tgc report's page; --fuzz: clang and its
#                                 libFuzzer, for scripts/fuzz.sh)
set -euo pipefail

packages=(cmake g++ make llvm-16-dev llvm-16-tools libfmt-dev libgtest-dev
          zlib1g-dev libzstd-dev libncurses-dev libxml2-dev python3 libsentencepiece-dev)
for flag in "$@"; do
  case "$flag" in
    --tests) packages+=(chromium) ;;
    --fuzz) packages+=(clang-16 libclang-rt-16-dev) ;;
    *) echo "setup: unknown flag $flag (--tests, --fuzz)" >&2; exit 1 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
