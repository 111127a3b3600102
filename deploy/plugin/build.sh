#!/usr/bin/env bash
# Build the hubproxy-plugin image (Containerfile here) without any container registry, and copy
# its executable out.
#
#   deploy/plugin/build.sh [TAG]        # default TAG: localhost/hubproxy-plugin:dev; prints TAG
#
# Where docker or podman can pull base images,
# `docker build -f deploy/plugin/Containerfile -t TAG .` is all you need. Here, as
# deploy/image/build.sh does: mmdebstrap makes the Debian bookworm build root once (cached, and
# shared with the hubproxy image, see ../image/bases.sh), buildah builds the Containerfile on it
# (--pull=never, chroot isolation, vfs storage).
#
# A build is skipped when an image built from the same inputs exists: it is also tagged
# localhost/hubproxy-plugin:inputs-<hash>, where <hash> covers the Containerfile, the build
# recipe, pyproject.toml, README.md, gateway/ and the build root. A cold build takes about two
# minutes on two cores (one more when the build root must be made), a skipped one seconds.
#
# The executable is copied to $HUBPROXY_PLUGIN_CACHE/hubproxy-plugin (default
# ~/.cache/hubproxy-plugin/hubproxy-plugin), where `hubproxy demo` looks for it.
#
# Environment: HUBPROXY_IMAGE_CACHE, HUBPROXY_IMAGE_STORE, DEBIAN_MIRROR, PIP_CERT and
# HUBPROXY_IMAGE_PRUNE as for deploy/image/build.sh; HUBPROXY_PLUGIN_CACHE as above.
# Needs root (or a user namespace set up for buildah) and Debian's buildah and mmdebstrap.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TAG="${1:-localhost/hubproxy-plugin:dev}"
CACHE="${HUBPROXY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hubproxy-image}"
OUT="${HUBPROXY_PLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hubproxy-plugin}"
. "$ROOT/deploy/image/bases.sh"
BUILD_BASE="$(build_base)"

inputs="$(cd "$ROOT" && {
  "${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$BUILD_BASE"
  find deploy/plugin -maxdepth 1 -type f ! -name build.sh -print0 | sort -z | xargs -0 sha256sum
  find gateway -name '*.py' -print0 | sort -z | xargs -0 sha256sum
  sha256sum pyproject.toml README.md
} | sha256sum | cut -c1-16)"
BUILT="localhost/hubproxy-plugin:inputs-$inputs"

if "${buildah[@]}" inspect --type image "$BUILT" >/dev/null 2>&1; then
  echo "build.sh: $BUILT exists, built from the same inputs" >&2
else
  ca=()
  if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    ca=(-v "$PIP_CERT:/run/hubproxy-build-ca.crt:ro" --build-arg PIP_CERT=/run/hubproxy-build-ca.crt)
  fi
  started=$SECONDS
  "${buildah[@]}" bud --isolation chroot --pull=never --layers=false "${ca[@]}" \
    --build-arg BUILD_IMAGE="$BUILD_BASE" \
    -t "$BUILT" -f "$ROOT/deploy/plugin/Containerfile" "$ROOT" >&2
  echo "build.sh: built $BUILT in $((SECONDS - started)) s" >&2
fi
"${buildah[@]}" tag "$BUILT" "$TAG"

# The executable, for the demo and for running it outside a container.
ctr="$("${buildah[@]}" from --pull-never --quiet "$TAG")"
trap '"${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt="$("${buildah[@]}" mount "$ctr")"
mkdir -p "$OUT"
partial="$(mktemp "$OUT/.hubproxy-plugin.XXXXXX")"
cp "$mnt/bin/hubproxy-plugin" "$partial"
chmod 0555 "$partial"
mv "$partial" "$OUT/hubproxy-plugin"
"${buildah[@]}" umount "$ctr" >/dev/null

if [ "${HUBPROXY_IMAGE_PRUNE:-0}" = 1 ]; then
  "${buildah[@]}" rmi --prune >/dev/null 2>&1 || true
fi
# sed, not head: head would stop reading, and buildah (several lines: the image has two tags)
# would die of SIGPIPE, failing the pipeline.
size="$("${buildah[@]}" images --noheading --format '{{.Size}}' "$TAG" | sed -n 1p)"
echo "build.sh: $TAG ($size), executable in $OUT/hubproxy-plugin" >&2
echo "$TAG"
