#!/usr/bin/env bash
# A Debian root filesystem made from Debian's packages (mmdebstrap), imported as a local base image
# (podman), for building deploy/container/Containerfile where no base image can be pulled:
#
#   deploy/container/debian-base.sh [IMAGE]        # default localhost/mcpipe-debian:trixie
#   podman build --build-arg BASE=localhost/mcpipe-debian:trixie -f deploy/container/Containerfile .
#
# It holds what the Containerfile expects of its base (what python:3.13-slim-trixie has): Python 3.13 with
# venv, CA certificates, and an apt that can install more (the build stage installs Rust from Debian).
# CA certificates the host added (/usr/local/share/ca-certificates, for a TLS-intercepting proxy) are
# copied in, so the build can reach PyPI and crates.io from behind that proxy as the host does.
# Needs root (or podman unshare), mmdebstrap and podman; about a minute and 150 MB. DEBIAN_INCLUDE adds
# packages: `DEBIAN_INCLUDE=redis-server debian-base.sh localhost/mcpipe-redis:trixie` is the Redis that
# deploy/compose runs here (REDIS_IMAGE), where the public redis image cannot be pulled.
set -euo pipefail
image=${1:-localhost/mcpipe-debian:trixie}
suite=${DEBIAN_SUITE:-trixie}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "debian-base.sh: $tool is not installed (apt-get install $tool)" >&2; exit 2; }
done
hooks=()
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  hooks+=(--customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"'
          --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"'
          --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1')
fi
mmdebstrap --quiet --variant=minbase --include="python3,python3-venv,ca-certificates${DEBIAN_INCLUDE:+,$DEBIAN_INCLUDE}" \
  --components=main "${hooks[@]}" \
  --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/var/cache/apt/*.bin' \
  "$suite" - "$mirror" \
  | podman import --quiet --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
echo "$image"
