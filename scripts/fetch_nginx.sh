#!/usr/bin/env bash
# Fetch nginx for lesson 05's optional proxy section (05.proxy-limit) without installing a system service: Debian's
# package is downloaded and unpacked into the course cache, where utils.core.env finds it. Nothing is started and
# nothing outside the cache folder changes. Prints the binary's path on the last line.
#
#   scripts/fetch_nginx.sh      (Debian or Ubuntu with apt; elsewhere install nginx with your package manager)
set -euo pipefail
dest="${XDG_CACHE_HOME:-$HOME/.cache}/ml-workbook/nginx"
bin="$dest/usr/sbin/nginx"
if [ -x "$bin" ] && "$bin" -v >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "error: no apt-get/dpkg-deb here: install nginx with your package manager (lesson 05 finds it on PATH)" >&2
  exit 2
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download nginx >/dev/null 2>&1) || {
  [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download nginx >/dev/null 2>&1)
} || { echo "error: apt-get download nginx failed (run 'apt-get update' first?)" >&2; exit 1; }
rm -rf "$dest" && mkdir -p "$dest"
dpkg-deb -x "$tmp"/nginx_*.deb "$dest"
"$bin" -v >&2
echo "$bin"
