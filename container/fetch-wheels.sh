#!/usr/bin/env bash
# Fills container/wheelhouse/<variant>/ with every wheel the image's Python environment needs, so that the image
# build itself downloads nothing (what an air-gapped cluster needs too: fetch here, carry the directory over).
#   usage: container/fetch-wheels.sh [cpu|gpu]      (default: cpu)
# Wheels are for the image's Python (IMAGE_PYTHON_VERSION, default 3.11: Debian 12's, the CPU base) on x86_64.
# Transitive versions are pinned by the repository's constraints.txt, so the image runs what .venv runs.
# pip's own configuration applies (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_CERT for a proxy's CA), and a wheel that
# is already in the directory is not fetched again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
variant=${1:-cpu}
python=${PYTHON:-python3}
py_version=${IMAGE_PYTHON_VERSION:-3.11}
requirements="$here/requirements-$variant.txt"
[ -f "$requirements" ] || { echo "unknown variant '$variant': no $requirements" >&2; exit 2; }
dest="$here/wheelhouse/$variant"
mkdir -p "$dest"

# PyPI's Linux torch is the CUDA build; the CPU build (2.13.0+cpu) lives on PyTorch's own index.
extra=()
if [ "$variant" = cpu ]; then
  extra+=(--extra-index-url "${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
fi
# The constraints pin torch as 2.13.0 (the controller's build), which 2.13.0+cpu satisfies.
# One retry: an unreachable index (no DNS on an air-gapped machine) must not stall for minutes.
"$python" -m pip download --disable-pip-version-check --quiet --retries 1 \
  --only-binary=:all: --python-version "$py_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "${extra[@]}" --dest "$dest" -r "$requirements" -c "$here/../constraints.txt"
echo "wheelhouse $dest: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1)"
