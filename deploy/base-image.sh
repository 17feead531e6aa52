#!/usr/bin/env bash
# A minimal Debian bookworm image with python3 and python3-venv, built from Debian packages
# with debootstrap and loaded with `docker import`: the base for deploy/Dockerfile.* where no
# image registry is reachable (users with a registry keep python:3.x-slim).
#
#   sudo deploy/base-image.sh [TAG]            # default tag: seedrl-base:bookworm
#   docker build --build-arg BASE_IMAGE=seedrl-base:bookworm -f deploy/Dockerfile.learner .
#
# Environment: SEEDRL_BASE_TARBALL=path keeps the root filesystem as a tarball there and
# imports it again on the next call instead of running debootstrap (what the cluster test
# caches); DEBIAN_MIRROR picks the package mirror. Needs root, debootstrap and docker.
set -euo pipefail

tag="${1:-seedrl-base:bookworm}"
suite=bookworm
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
tarball="${SEEDRL_BASE_TARBALL:-}"

import() {
  # The image carries no metadata of its own: PATH, a UTF-8 locale and a shell command.
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$1" "$tag" >/dev/null
  echo "imported $tag"
}

if [ -n "$tarball" ] && [ -s "$tarball" ]; then
  import "$tarball"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "base-image.sh: debootstrap needs root (run it with sudo)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || {
  echo "base-image.sh: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 2
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 20 "$work/debootstrap.log" >&2
  exit 1
}
# What only the build needed: downloaded packages, package lists, docs and translations.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
out="${tarball:-$work/rootfs.tar}"
mkdir -p "$(dirname "$out")"
tar --numeric-owner -C "$root" -cf "$out.part" .
mv "$out.part" "$out"
import "$out"
