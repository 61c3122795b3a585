#!/usr/bin/env bash
# A small stand-in for LLVM's lit: runs the RUN: lines of one test file with bash -o pipefail.
#   lit.sh TEST TGC FILECHECK NOT SOURCE_DIR
# Substitutions: %s the test file, %tgc the runner, %models the models folder, %t a scratch
# path; FileCheck, not and split-file are LLVM's.
set -u
test=$1 tgc=$2 filecheck=$3 not=$4 src=$5
splitfile=$(dirname "$filecheck")/split-file
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
n=0
while IFS= read -r line; do
  cmd=${line#*RUN: }
  cmd=${cmd//%tgc/$tgc}
  cmd=${cmd//%models/$src/models}
  cmd=${cmd//%s/$test}
  cmd=${cmd//%t/$scratch/t}
  cmd=${cmd//FileCheck /$filecheck }
  cmd=${cmd//not /$not }
  cmd=${cmd//split-file /$splitfile }
  n=$((n + 1))
  echo "RUN $n: $cmd"
  if ! (cd "$src" && bash -o pipefail -c "$cmd"); then
    echo "FAILED: RUN line $n of $test"
    status=1
  fi
done < <(grep -E '^(#|//) RUN: ' "$test")
if [ "$n" -eq 0 ]; then
  echo "no RUN lines in $test"
  exit 1
fi
exit $status
