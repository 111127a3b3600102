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
#    - the build image: minbase + python3, python3-venv, binutils;
#    - the runtime image: python3 and the libraries it links, extracted only (no shell, no
#      package manager, no maintainer scripts), the standard library compiled, /tmp.
# 2. buildah imports them as localhost/hubproxy-build-base:bookworm and
#    localhost/hubproxy-base:bookworm, once.
# 3. buildah builds the Containerfile on them (--pull=never, chroot isolation, vfs storage: no
#    daemon, no cgroups, no overlay mounts needed), tags TAG and prints it on stdout.
#
# Environment:
#   HUBPROXY_IMAGE_CACHE   where the root filesystem tarballs are kept (delete to refresh)
#   HUBPROXY_IMAGE_STORE   a private buildah storage directory (default: buildah's own)
#   DEBIAN_MIRROR          mmdebstrap mirror (default: its own, deb.debian.org)
#   PIP_CERT               a CA bundle pip needs to reach PyPI (a TLS-inspecting proxy); it is
#                          mounted into the build step, never copied into the image
# Needs root (or a user namespace set up for buildah) and Debian's buildah and mmdebstrap.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TAG="${1:-localhost/hubproxy:dev}"
CACHE="${HUBPROXY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hubproxy-image}"
BUILD_BASE=localhost/hubproxy-build-base:bookworm
RUN_BASE=localhost/hubproxy-base:bookworm
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: $tool is missing (Debian: apt-get install -y buildah mmdebstrap)" >&2
    exit 3
  }
done

buildah=(buildah)
if [ -n "${HUBPROXY_IMAGE_STORE:-}" ]; then
  buildah+=(--root "$HUBPROXY_IMAGE_STORE/root" --runroot "$HUBPROXY_IMAGE_STORE/run")
fi

# Never read in a container: documentation, manual pages, translations.
slim=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*')
# bookworm's usrmerge package would pull in perl; the hook makes the merged /usr itself.
merged=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)

rootfs() {  # NAME MMDEBSTRAP-ARGS...: the cached tarball's path, made if missing
  local tar="$CACHE/$1.tar"
  shift
  if [ ! -s "$tar" ]; then
    mkdir -p "$CACHE"
    echo "build.sh: making $tar with mmdebstrap (once)" >&2
    mmdebstrap --format=tar "${slim[@]}" "${merged[@]}" "$@" bookworm "$tar.part" \
      ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >&2
    mv "$tar.part" "$tar"
  fi
  echo "$tar"
}

import() {  # IMAGE TARBALL
  "${buildah[@]}" inspect --type image "$1" >/dev/null 2>&1 && return
  echo "build.sh: importing $2 as $1" >&2
  local ctr
  ctr="$("${buildah[@]}" from scratch)"
  "${buildah[@]}" add "$ctr" "$2" / >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/bin:/usr/bin:/bin "$ctr"
  "${buildah[@]}" commit --rm --quiet "$ctr" "$1" >/dev/null
}

if ! "${buildah[@]}" inspect --type image "$BUILD_BASE" >/dev/null 2>&1; then
  import "$BUILD_BASE" "$(rootfs bookworm-build --variant=minbase \
    --include=python3,python3-venv,binutils --aptopt='APT::Install-Recommends "false"')"
fi
if ! "${buildah[@]}" inspect --type image "$RUN_BASE" >/dev/null 2>&1; then
  # extract: no maintainer scripts run, so compile the standard library here (py3compile
  # would have in postinst); the image's root filesystem is read-only at run time.
  import "$RUN_BASE" "$(rootfs bookworm-python3 --variant=extract --include=python3 \
    --customize-hook='chroot "$1" /usr/bin/python3 -m compileall -q -j 0 /usr/lib/python3.11' \
    --customize-hook='mkdir -p "$1/tmp" && chmod 1777 "$1/tmp"')"
fi

ca=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  ca=(-v "$PIP_CERT:/run/hubproxy-build-ca.crt:ro" --build-arg PIP_CERT=/run/hubproxy-build-ca.crt)
fi
"${buildah[@]}" bud --isolation chroot --pull=never --layers "${ca[@]}" \
  --build-arg BUILD_IMAGE="$BUILD_BASE" --build-arg BASE_IMAGE="$RUN_BASE" \
  -t "$TAG" -f "$ROOT/Containerfile" "$ROOT" >&2
size="$("${buildah[@]}" images --noheading --format '{{.Size}}' "$TAG" | head -1)"
echo "build.sh: built $TAG ($size)" >&2
echo "$TAG"
