#!/bin/sh
# make deb: a Debian package of moonloop, from a staged `cmake --install`.
#
# Builds a Release binary in $DEB_BUILD (default build/deb: no -Werror, no
# fault points, as a packager builds it) with the prefix /usr and the
# configuration in /etc, installs it into a staging folder, compresses the
# man page, adds the package's control files (dependencies from
# dpkg-shlibdeps, the configuration as a conffile, maintainer scripts that
# tell systemd about the unit) and builds the .deb with dpkg-deb into
# $DEB_OUT (default build/). Prints the package's path last.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${DEB_BUILD:-$top/build/deb}
out=${DEB_OUT:-$top/build}
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_INSTALL_SYSCONFDIR=/etc -DMOONLOOP_SYSTEMD_UNIT_DIR=/usr/lib/systemd/system \
  -DMOONLOOP_ZSH_COMPLETION_DIR=share/zsh/vendor-completions >/dev/null
cmake --build "$build" -j "$jobs" --target moonloop help_files >"$build/build.log" 2>&1 ||
  { tail -40 "$build/build.log"; exit 1; }

stage="$build/stage"
rm -rf "$stage"
DESTDIR="$stage" cmake --install "$build" --strip >/dev/null
gzip -9n "$stage/usr/share/man/man1/moonloop.1"

version=$("$stage/usr/bin/moonloop" --version | sed 's/^moonloop //')
arch=$(dpkg --print-architecture)
doc="$stage/usr/share/doc/moonloop"
mkdir -p "$doc"
cat >"$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: moonloop
Comment: Built from the moonloop source tree by scripts/deb.sh. The source
 declares no licence yet; until it does, this package is for the use of
 those who have the source.
EOF
printf 'moonloop (%s) unstable; urgency=medium\n\n  * Built by scripts/deb.sh.\n\n -- moonloop maintainers <maintainers@localhost>  %s\n' \
  "$version" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(date +%s)}")" | gzip -9n >"$doc/changelog.Debian.gz"

# Dependencies: the shared libraries the binary links, as Debian names them.
shl=$(mktemp -d)
mkdir -p "$shl/debian"
printf 'Source: moonloop\n\nPackage: moonloop\nArchitecture: any\n' >"$shl/debian/control"
depends=$(cd "$shl" && dpkg-shlibdeps -O -e"$stage/usr/bin/moonloop" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
rm -rf "$shl"
[ -n "$depends" ] || { echo "deb: dpkg-shlibdeps found no dependencies (is dpkg-dev installed?)" >&2; exit 1; }

mkdir -p "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: moonloop
Version: $version
Architecture: $arch
Maintainer: moonloop maintainers <maintainers@localhost>
Installed-Size: $size
Depends: $depends
Recommends: systemd
Section: admin
Priority: optional
Homepage: https://localhost/moonloop
Description: durable orchestration engine for agent loops
 Skills are Lua files; every run is a coroutine that yields to a C core on
 every step, which checkpoints the step in SQLite, so a run killed at any
 moment resumes from its last completed step. One binary with an HTTP API,
 a dashboard and a workspace watcher; moonloop.service runs it as a
 sandboxed system service.
EOF
echo /etc/moonloop/moonloop.conf.lua >"$stage/DEBIAN/conffiles"
# The unit is not enabled or started on install: the engine needs its
# configuration (a token, an LLM endpoint) and skills first. docs/operations.md.
cat >"$stage/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null || true; fi
exit 0
EOF
cat >"$stage/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop moonloop.service >/dev/null 2>&1 || true
  systemctl disable moonloop.service >/dev/null 2>&1 || true
fi
exit 0
EOF
cat >"$stage/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null || true; fi
# The state (/var/lib/moonloop: the database and the skills) is kept, also on
# purge: it is the history of every run. Remove it by hand when it is no longer wanted.
exit 0
EOF
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

deb="$out/moonloop_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
