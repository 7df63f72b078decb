#!/usr/bin/env bash
# Builds the training image on this machine from a staged context (container/ recipe, train/, the wheelhouse):
# nothing is downloaded during the build, and the repository's other files never reach the daemon.
#   usage: container/build.sh [cpu|gpu] [IMAGE]     (defaults: cpu, ddp-train:<variant>)
#   BASE_IMAGE=...   another base (default: cpu = ddp-base:debian12, built here; gpu = the Dockerfile's NGC tag)
# The image carries the hash of its inputs (label ddp.context): when nothing changed, nothing is built.
# Then labels ddp.torch, ddp.cuda, ddp.nccl and ddp.python record what torch inside the image reports.
# The last line printed is "built <image id>" or "current <image id>" (the train_image role reads it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
# One build at a time on this machine (two make commands, or make test's lanes): the staged context, the base
# image and the wheelhouse are shared, and a build that waited finds the image current.
mkdir -p "$root/.cache"
exec 9>"$root/.cache/image-build.lock"
flock 9
variant=${1:-cpu}
image=${2:-ddp-train:$variant}
case "$variant" in
  cpu) base=${BASE_IMAGE:-ddp-base:debian12} ;;
  gpu) base=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$here/Dockerfile")} ;;
  *) echo "unknown variant '$variant' (expected cpu or gpu)" >&2; exit 2 ;;
esac

if [ "$variant" = cpu ] && [ -z "${BASE_IMAGE:-}" ]; then
  "$here/build-base.sh" debian12 >&2
fi
base_id=$(docker image inspect --format '{{.Id}}' "$base" 2>/dev/null) || {
  echo "base image $base is not on this machine: load it (docker load) or pull it from your registry" >&2
  exit 1
}
if ! compgen -G "$here/wheelhouse/$variant/*.whl" >/dev/null; then
  "$here/fetch-wheels.sh" "$variant" >&2
fi

# The context sits beside the wheelhouse, on the same filesystem, so the wheels are hard links, not copies.
context="$root/.cache/image-context/$variant"
rm -rf "$context"
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/container"
cp "$here/Dockerfile" "$here/versions.py" "$here/requirements-$variant.txt" "$context/container/"
mkdir -p "$context/container/wheelhouse"
cp -al "$here/wheelhouse/$variant" "$context/container/wheelhouse/$variant" 2>/dev/null \
  || cp -a "$here/wheelhouse/$variant" "$context/container/wheelhouse/$variant"
tar -C "$root" --exclude=__pycache__ --exclude='*.pyc' -cf - train | tar -C "$context" -xf -

inputs_hash=$(
  { (cd "$context" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum)
    echo "$variant $base_id"; } | sha256sum | cut -c1-16
)
if [ "$(docker image inspect --format '{{index .Config.Labels "ddp.context"}}' "$image" 2>/dev/null)" = "$inputs_hash" ]
then
  echo "image $image is current (inputs $inputs_hash)" >&2
  echo "current $(docker image inspect --format '{{.Id}}' "$image")"
  exit 0
fi

echo "building $image ($variant, base $base, inputs $inputs_hash)" >&2
docker build --file "$context/container/Dockerfile" --build-arg "BASE_IMAGE=$base" --build-arg "VARIANT=$variant" \
  --tag "$image" "$context" >&2

# The image's default command prints what torch inside reports; a label cannot come from the build itself.
# ddp.context goes on last, so an interrupted build is never taken for a current one.
versions=$(docker run --rm --network none "$image")
labels=$(printf '%s' "$versions" | python3 -c '
import json, sys
versions = json.load(sys.stdin)
pairs = [f"ddp.{key}={versions[key] or None}" for key in ("torch", "cuda", "nccl", "python")]
print(" ".join(pairs + ["ddp.context=" + sys.argv[1]]))' "$inputs_hash")
printf 'FROM %s\nLABEL %s\n' "$image" "$labels" | docker build --quiet --tag "$image" - >/dev/null
echo "built $image: $labels" >&2
echo "built $(docker image inspect --format '{{.Id}}' "$image")"
