# Debian bookworm base images made with mmdebstrap and imported into buildah: sourced by
# deploy/image/build.sh (the hubproxy image) and deploy/plugin/build.sh (the plugin image), which
# share the build root. Needs: CACHE (where the root filesystem tarballs are kept). Sets the array
# `buildah` (the buildah command with its storage flags) and exits 3 when a tool is missing.

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

# NAME MMDEBSTRAP-ARGS...: a base image made from a cached mmdebstrap tarball. Both are named
# after a hash of the arguments, so changing a recipe makes new ones (old ones stay until the
# cache directory or the images are removed). One build at a time makes a given tarball: two
# builds that need it at once (the image and plugin tests) wait for each other.
base_image() {
  local name="$1" key
  shift
  key="$(printf '%s\n' "${slim[@]}" "${merged[@]}" "$@" | sha256sum | cut -c1-12)"
  local image="localhost/hubproxy-$name:bookworm-$key" tar="$CACHE/$name-$key.tar"
  if ! "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    mkdir -p "$CACHE"
    (
      flock 9
      if [ ! -s "$tar" ]; then
        echo "bases.sh: making $tar with mmdebstrap (once)" >&2
        mmdebstrap --format=tar "${slim[@]}" "${merged[@]}" "$@" bookworm "$tar.part" \
          ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >&2
        mv "$tar.part" "$tar"
      fi
    ) 9>"$tar.lock"
    echo "bases.sh: importing $tar as $image" >&2
    local ctr
    ctr="$("${buildah[@]}" from scratch)"
    "${buildah[@]}" add "$ctr" "$tar" / >/dev/null
    "${buildah[@]}" config --env PATH=/usr/local/bin:/usr/bin:/bin "$ctr"
    "${buildah[@]}" commit --rm --quiet "$ctr" "$image" >/dev/null
  fi
  echo "$image"
}

# The build root of both images: python3 with venv; libpython3.11, the shared library that
# PyInstaller bundles into the plugin (Debian's python3 links it statically); binutils for strip.
build_base() {
  base_image build-base --variant=minbase \
    --include=python3,python3-venv,libpython3.11,binutils --aptopt='APT::Install-Recommends "false"'
}

# The hubproxy image's build root: the above, and gcc with the C library's and Python's headers,
# which compile the request path (setup.py). The plugin needs no compiler.
compile_base() {
  base_image compile-base --variant=minbase \
    --include=python3,python3-venv,libpython3.11,binutils,gcc,libc6-dev,libpython3.11-dev \
    --aptopt='APT::Install-Recommends "false"'
}
