#!/usr/bin/env bash
# Debian packages for a set-up script: `apt-install.sh WHO PACKAGE...` installs them as root
# through apt-get, starting no service (policy-rc.d 101: a package's scripts may not start
# one on this machine), or says how to and exits 2. sshd-, browser- and fuse-setup.sh use it.
set -euo pipefail
who=$1
shift
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "$who: install Debian's $* (apt-get install $*) as root" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends "$@" > /dev/null
