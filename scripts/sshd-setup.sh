#!/usr/bin/env bash
# OpenSSH's server for the fleet tests (tests/fleet_hosts.py): each test host is a network
# namespace running its own sshd. Nothing when sshd is there; else apt-get (root) installs
# Debian's openssh-server. Its service is not started: the tests start their own sshd.
set -euo pipefail
if [ -x /usr/sbin/sshd ]; then
    echo "sshd ready: /usr/sbin/sshd"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "sshd-setup: install Debian's openssh-server (apt-get install openssh-server) as root" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: the package's scripts start no service on this machine.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends openssh-server iproute2 > /dev/null
echo "sshd ready: /usr/sbin/sshd"
