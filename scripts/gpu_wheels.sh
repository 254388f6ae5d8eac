#!/usr/bin/env bash
# Wheels of the packages marl_jax needs that the device machines' image lacks (it has jax, flax, optax,
# orbax, chex, torch, transformers, tokenizers, safetensors, matplotlib, ...; nothing can be fetched
# there), at the versions installed here, for its Python 3.12, into .whl (git-ignored).  A device run
# carries .whl and scripts/gpu_checks.sh installs them first.
#
#   bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(ml-collections tensorboardx tensorflow-datasets array-record grain dm-tree docstring-parser
          googleapis-common-protos immutabledict portpicker promise simple-parsing tensorflow-metadata
          termcolor toml truststore httpcore2 httpx2)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)
rm -rf .whl && mkdir .whl
for name in "${PACKAGES[@]}"; do
  pinned="$name==$(python -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")"
  # A package published only as source (promise) is built here: pure Python, so it runs there too.
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]/#/--platform=}" -d .whl "$pinned" 2>/dev/null \
    || python -m pip wheel -q --no-deps -w .whl "$pinned"
done
ls .whl
du -sh .whl
