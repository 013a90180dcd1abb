#!/usr/bin/env bash
# OpenSSH's server for the fleet tests (tests/fleet_hosts.py): each test host is a network
# namespace running its own sshd. Nothing when sshd is there; else apt-get (root) installs
# Debian's openssh-server. Its service is not started: the tests start their own sshd.
set -euo pipefail
if [ ! -x /usr/sbin/sshd ]; then
    "$(dirname "$0")/apt-install.sh" sshd-setup openssh-server iproute2
fi
echo "sshd ready: /usr/sbin/sshd"
