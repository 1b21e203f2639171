#!/usr/bin/env bash
# The base image of THORN's registry-free containers: Debian bookworm from debootstrap
# (minbase) with Python 3.11 and venv, iproute2 (the programmer's `ip`/`tc`) and wget (the
# NATS health check), imported into podman as localhost/thorn-base:bookworm.
#
#   deploy/podman/build-base.sh        # needs root, podman and debootstrap
#
# Cached: nothing is done when the image exists with the label thorn.base.inputs equal to
# the hash of this script and its settings (debootstrap takes about a minute).
set -euo pipefail

IMAGE=${THORN_BASE_IMAGE:-localhost/thorn-base:bookworm}
SUITE=bookworm
MIRROR=${THORN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,iproute2,wget

inputs=$( { printf '%s\n' "$SUITE" "$MIRROR" "$PACKAGES"; cat "$0"; } | sha256sum | cut -c1-16)
label='{{index .Labels "thorn.base.inputs"}}'
if [ "$(podman image inspect --format "$label" "$IMAGE" 2>/dev/null)" = "$inputs" ]; then
    echo "$IMAGE is up to date (inputs $inputs)"
    exit 0
fi

rootfs=$(mktemp -d /var/tmp/thorn-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
# Two stages, to switch off dpkg's fsyncs in between (as Debian's official container images
# do, "docker-apt-speedup"): a crash mid-build throws the whole layer away anyway, and the
# install stage takes about half the time without them.
debootstrap --foreign --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR"
echo force-unsafe-io > "$rootfs/etc/dpkg/dpkg.cfg.d/thorn-unsafe-io"
chroot "$rootfs" /debootstrap/debootstrap --second-stage

# Slim, as Debian's own container images are: no downloaded packages or package lists (a
# derived image runs `apt-get update` first), no docs, man pages or translations, now or in
# packages installed later; no recommends.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/usr/share/info/*
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/thorn-slim" <<'CONF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/info/*
CONF
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    > "$rootfs/etc/apt/apt.conf.d/thorn-no-recommends"
echo "deb http://deb.debian.org/debian-security $SUITE-security main" \
    >> "$rootfs/etc/apt/sources.list"

tar -C "$rootfs" -c . | podman import \
    --change "LABEL thorn.base.inputs=$inputs" \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE"
echo "built $IMAGE (inputs $inputs)"
