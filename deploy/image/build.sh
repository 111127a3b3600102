#!/usr/bin/env bash
# Build the hubproxy image from ../../Containerfile without any container registry.
#
#   deploy/image/build.sh [TAG]          # default TAG: localhost/hubproxy:dev; prints TAG
#
# Where docker or podman can pull base images, `docker build -t TAG .` is all you need. This
# script is for machines that reach only Debian's and PyPI's package registries (CI here):
#
# 1. mmdebstrap makes two Debian bookworm root filesystems, cached as tarballs in
#    $HUBPROXY_IMAGE_CACHE (default ~/.cache/hubproxy-image):
#    - the build image: minbase + python3, python3-venv, libpython3.11, binutils, and gcc with
#      the C library's and Python's headers for the compiled request path (see bases.sh);
#    - the runtime image: python3 and the libraries it links, extracted only (no shell, no
#      package manager, no maintainer scripts), the standard library compiled, /tmp.
# 2. buildah imports them as localhost/hubproxy-compile-base:bookworm-<hash> and
#    localhost/hubproxy-base:bookworm-<hash> (<hash>: of the mmdebstrap arguments), once.
# 3. buildah builds the Containerfile on them (--pull=never, chroot isolation, vfs storage: no
#    daemon, no cgroups, no overlay mounts needed), tags TAG and prints it on stdout.
#
# Environment:
#   HUBPROXY_IMAGE_CACHE   where the root filesystem tarballs are kept (delete to refresh
#                          Debian's packages)
#   HUBPROXY_IMAGE_STORE   a private buildah storage directory (default: buildah's own)
#   DEBIAN_MIRROR          mmdebstrap mirror (default: its own, deb.debian.org)
#   PIP_CERT               a CA bundle pip needs to reach PyPI (a TLS-inspecting proxy); it is
#                          mounted into the build step, never copied into the image
#   HUBPROXY_IMAGE_PRUNE   1: afterwards remove untagged images (earlier builds' leftovers and
#                          the layer cache), so a store that builds often stays small (vfs
#                          keeps a full copy per layer)
# Needs root (or a user namespace set up for buildah) and Debian's buildah and mmdebstrap.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TAG="${1:-localhost/hubproxy:dev}"
CACHE="${HUBPROXY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hubproxy-image}"
. "$ROOT/deploy/image/bases.sh"

BUILD_BASE="$(compile_base)"
# extract: packages unpacked, no maintainer scripts, so no shell or package manager needed in
# the image; the standard library is compiled here instead (py3compile would have in postinst;
# the image's root filesystem is read-only at run time), and /tmp made.
RUN_BASE="$(base_image base --variant=extract --include=python3 \
  --extract-hook='chroot "$1" /usr/bin/python3 -m compileall -q /usr/lib/python3.11' \
  --extract-hook='mkdir -p "$1/tmp" && chmod 1777 "$1/tmp"')"

ca=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  ca=(-v "$PIP_CERT:/run/hubproxy-build-ca.crt:ro" --build-arg PIP_CERT=/run/hubproxy-build-ca.crt)
fi
"${buildah[@]}" bud --isolation chroot --pull=never --layers "${ca[@]}" \
  --build-arg BUILD_IMAGE="$BUILD_BASE" --build-arg BASE_IMAGE="$RUN_BASE" \
  -t "$TAG" -f "$ROOT/Containerfile" "$ROOT" >&2
if [ "${HUBPROXY_IMAGE_PRUNE:-0}" = 1 ]; then
  "${buildah[@]}" rmi --prune >/dev/null 2>&1 || true
fi
size="$("${buildah[@]}" images --noheading --format '{{.Size}}' "$TAG" | head -1)"
echo "build.sh: built $TAG ($size)" >&2
echo "$TAG"
