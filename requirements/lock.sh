#!/usr/bin/env bash
# Regenerates requirements/cluster.lock, what every cluster node and the cluster image (docker/Dockerfile) install:
# exact versions, with the sha256 of every file of each, of pyproject.toml's dependencies and cluster.in, resolved
# against PyPI (https://pypi.org/simple) for Linux x86_64 with glibc 2.28 or newer (manylinux_2_28) and Python 3.12,
# the python3 of Ubuntu 24.04 (cluster.yaml's image). Torch is PyPI's Linux build, the CUDA one (its CUDA libraries
# come as nvidia-* wheels): the GPU workers train on it and the CPU-only head runs it on the CPU. Every locked
# package has a wheel there, so the nodes build nothing but rayfl. Needs uv (`pip install uv`; UV=path/to/uv when
# it is not on PATH). From anywhere:
#
#   bash requirements/lock.sh                    # keeps the current pins, re-resolving only what the inputs changed
#   bash requirements/lock.sh --upgrade          # every package to its newest release that the inputs admit
#   LOCK_PYTHON=3.11 bash requirements/lock.sh   # for machines whose python3 is another version (cluster-onprem.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
"${UV:-uv}" pip compile pyproject.toml requirements/cluster.in \
    --generate-hashes \
    --only-binary :all: \
    --python-version "${LOCK_PYTHON:-3.12}" \
    --python-platform x86_64-manylinux_2_28 \
    --index-url https://pypi.org/simple \
    --no-config \
    --custom-compile-command "bash requirements/lock.sh" \
    --output-file requirements/cluster.lock \
    --quiet \
    "$@"
