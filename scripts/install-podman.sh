#!/usr/bin/env bash
# What the container tests need (issue 29; run as root, after install-multiuser.sh; idempotent):
# - Debian's podman, run rootless by the test users (uidmap for their subordinate ids, runc, the
#   OCI runtime that works on a hybrid cgroup host where crun refuses: "cgroups in hybrid mode not
#   supported"), and busybox-static for the test image;
# - subordinate uid/gid ranges for the test users (useradd makes them on Debian 12; added here
#   where missing), their podman settings (~/.config/containers: runc on a hybrid host, the
#   kernel's own overlay storage) and the test image, built here from the host's own files
#   (no registry is reachable from CI) and imported into each test user's storage:
#   localhost/gpujobs-test:latest = busybox (sh and the usual commands) + Debian's python3.11
#   with its standard library and the system libraries it and the test venv's extension
#   modules load (pyzmq: librt, libstdc++); no jupyter_gpujobs or ipykernel in it: the tests
#   mount the test venv (/opt/gpujobs-test, GPUJOBS_TEST_VENV) read-only into their containers.
# `GPUJOBS_TEST_IMAGE` names another image; `--image-tar FILE` only writes the image's tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "install-podman.sh: needs root (it installs packages and sets up the test users); skipped" >&2
    exit 0
fi
IMAGE=${GPUJOBS_TEST_IMAGE:-localhost/gpujobs-test:latest}
VENV=${GPUJOBS_TEST_VENV:-/opt/gpujobs-test}
USERS="gpujobs-u1 gpujobs-u2 gpujobs-admin1"

build_tar() {  # the test image's root as a tarball: $1
    local root
    root=$(mktemp -d)
    chmod 0755 "$root"
    mkdir -p "$root"/{bin,usr/bin,usr/lib,etc,tmp,dev,proc,sys,home,opt,var/tmp}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    local python
    python=$(readlink -f /usr/bin/python3)
    cp "$python" "$root/usr/bin/"
    ln -sf "$(basename "$python")" "$root/usr/bin/python3"
    cp -a "/usr/lib/$(basename "$python")" "$root/usr/lib/"
    # the shared libraries python and its extension modules load, at their own paths
    local libs
    libs=$( { ldd "$python"; find "/usr/lib/$(basename "$python")/lib-dynload" -name '*.so' -exec ldd {} \; ;
              [ -d "$VENV" ] && find "$VENV" -name '*.so*' -type f -exec ldd {} \; ; } \
            2>/dev/null | grep -o '/[^ ]*' | grep -v "^$VENV/" | sort -u || true)
    for lib in $libs; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
    printf 'root:x:0:\n' > "$root/etc/group"
    tar -C "$root" -cf "$1" .
    rm -rf "$root"
}

if [ "${1:-}" = "--image-tar" ]; then
    build_tar "$2"
    exit 0
fi

need=""
for cmd in podman newuidmap runc busybox; do
    command -v "$cmd" >/dev/null 2>&1 || need=1
done
if [ -n "$need" ]; then
    apt-get update -q >/dev/null
    apt-get install -y -q podman uidmap runc slirp4netns fuse-overlayfs busybox-static >/dev/null
fi

hybrid=""
[ -d /sys/fs/cgroup/unified ] && [ -d /sys/fs/cgroup/devices ] && hybrid=1

tar_file=$(mktemp --suffix=.tar)
trap 'rm -f "$tar_file"' EXIT
build_tar "$tar_file"
chmod 0644 "$tar_file"
for user in $USERS; do
    id "$user" >/dev/null 2>&1 || continue
    grep -q "^$user:" /etc/subuid || usermod --add-subuids "$(( 300000 + $(id -u "$user") * 65536 ))-$(( 300000 + $(id -u "$user") * 65536 + 65535 ))" "$user"
    grep -q "^$user:" /etc/subgid || usermod --add-subgids "$(( 300000 + $(id -u "$user") * 65536 ))-$(( 300000 + $(id -u "$user") * 65536 + 65535 ))" "$user"
    home=$(getent passwd "$user" | cut -d: -f6)
    conf="$home/.config/containers"
    runuser -u "$user" -- mkdir -p "$conf"
    if [ ! -e "$conf/storage.conf" ]; then
        # a fresh storage in the kernel's own rootless overlay (not vfs, which copies the image per run)
        runuser -u "$user" -- sh -c "cd / && podman system reset -f >/dev/null 2>&1 || true"
        printf '[storage]\ndriver = "overlay"\n' | runuser -u "$user" -- tee "$conf/storage.conf" >/dev/null
    fi
    if [ -n "$hybrid" ] && [ ! -e "$conf/containers.conf" ]; then
        printf '[engine]\nruntime = "runc"\n' | runuser -u "$user" -- tee "$conf/containers.conf" >/dev/null
    fi
    (cd / && runuser -u "$user" -- podman import -q --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
        "$tar_file" "$IMAGE" >/dev/null && runuser -u "$user" -- podman image prune -f >/dev/null)  # (the one it replaced)
done
echo "install-podman.sh: podman $(podman --version | cut -d' ' -f3), image $IMAGE for $USERS"
