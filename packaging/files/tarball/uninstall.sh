#!/bin/sh
# uninstall.sh: remove what install.sh installed.
#
# usage: uninstall.sh [--prefix DIR] [--destdir DIR] [--purge]
#   --prefix   the prefix given to install.sh (default: read from the copy of this
#              script installed in <prefix>/lib/qinglong-edge, else /usr, then
#              /usr/local).
#   --destdir  the staging root given to install.sh (also $DESTDIR).
#   --purge    also delete the configuration, credentials and state:
#              /etc/config/qinglong-edge*, /etc/qinglong-edge, /var/lib/qinglong-edge.
# The qinglong user is always kept (files may still belong to it, as on OpenWrt).
# /etc/crontabs/qinglong is removed even if you changed it.
# Exit status: 0 removed, 64 usage, 1 failure.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
me=uninstall.sh
die() { echo "$me: $*" >&2; exit 1; }
usage() { sed -n '2,16p' "$here/$me" | sed -n '/^#/s/^# \{0,1\}//p'; }
bad_usage() { echo "$me: $*" >&2; usage >&2; exit 64; }
plain_path() {
	case "$1" in /*) ;; *) return 1 ;; esac
	case "$1" in *[!A-Za-z0-9/._+-]*) return 1 ;; esac
}

prefix= purge=0
DESTDIR=${DESTDIR:-}
while [ $# -gt 0 ]; do
	case "$1" in
	--prefix | --destdir)
		[ $# -ge 2 ] || bad_usage "$1 needs a value"
		if [ "$1" = --prefix ]; then prefix=$2; else DESTDIR=$2; fi
		shift 2
		;;
	--prefix=*) prefix=${1#*=}; shift ;;
	--destdir=*) DESTDIR=${1#*=}; shift ;;
	--purge) purge=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) bad_usage "unknown argument: $1" ;;
	esac
done
if [ -n "$DESTDIR" ]; then
	plain_path "$DESTDIR" || bad_usage "--destdir must be an absolute path of [A-Za-z0-9/._+-]"
	DESTDIR=${DESTDIR%/}
	live=0
else
	live=1
	[ "$(id -u)" = 0 ] || die "run as root"
fi

conf=
if [ -n "$prefix" ]; then
	plain_path "$prefix" || bad_usage "--prefix must be an absolute path of [A-Za-z0-9/._+-]"
	conf=$DESTDIR${prefix%/}/lib/qinglong-edge/install.conf
elif [ -f "$here/install.conf" ] && [ -z "$DESTDIR" ]; then
	conf=$here/install.conf
else
	for candidate in /usr /usr/local; do
		if [ -f "$DESTDIR$candidate/lib/qinglong-edge/install.conf" ]; then
			conf=$DESTDIR$candidate/lib/qinglong-edge/install.conf
			break
		fi
	done
fi
[ -n "$conf" ] && [ -f "$conf" ] || die "no qinglong-edge installed by install.sh found (try --prefix)"
# Read the values, do not source the file.
target=$(sed -n 's/^QLE_TARGET=//p' "$conf")
prefix=$(sed -n 's/^QLE_PREFIX=//p' "$conf")
case "$target" in openwrt | systemd | plain) ;; *) die "$conf: unknown target '$target'" ;; esac
plain_path "$prefix" || [ -z "$prefix" ] || die "$conf: bad prefix"
bindir=$prefix/bin
libdir=$prefix/lib/qinglong-edge

if [ "$live" = 1 ]; then
	case "$target" in
	openwrt)
		if [ -x /etc/init.d/qinglong-edge ]; then
			/etc/init.d/qinglong-edge stop || true
			/etc/init.d/qinglong-edge disable || true
		fi
		;;
	systemd)
		# Stopping the pull service stops a resident pull (SIGTERM to it alone: it persists
		# and exits, KillMode=process). The remote jobs it leaves would run on with nobody
		# to report them (the cluster re-offers their Runs once the lease expires): end
		# whatever is left in the unit's cgroup.
		systemctl disable --now qinglong-edge-pull.timer qinglong-edge.service 2>/dev/null || true
		systemctl stop qinglong-edge-pull.service 2>/dev/null || true
		systemctl kill --signal=SIGKILL qinglong-edge-pull.service 2>/dev/null || true
		;;
	esac
fi
if [ -f "$DESTDIR$libdir/prerm-pkg" ]; then
	(
		IPKG_INSTROOT=$DESTDIR
		PKG_UPGRADE=0
		QLE_LIBDIR=$DESTDIR$libdir
		export IPKG_INSTROOT PKG_UPGRADE QLE_LIBDIR
		. "$DESTDIR$libdir/prerm-pkg"
	)
fi

case "$target" in
openwrt)
	rm -f "$DESTDIR/etc/init.d/qinglong-edge" "$DESTDIR/etc/crontabs/qinglong" \
		"$DESTDIR/etc/crontabs/qinglong-opkg" "$DESTDIR/lib/upgrade/keep.d/qinglong-edge"
	rm -f "$DESTDIR"/etc/rc.d/S??qinglong-edge "$DESTDIR"/etc/rc.d/K??qinglong-edge
	;;
systemd)
	rm -f "$DESTDIR/etc/systemd/system/qinglong-edge.service" \
		"$DESTDIR/etc/systemd/system/qinglong-edge-pull.service" \
		"$DESTDIR/etc/systemd/system/qinglong-edge-pull.timer"
	;;
esac
rm -f "$DESTDIR$bindir/qinglong-edge"
rm -rf "$DESTDIR$libdir"

if [ "$purge" = 1 ]; then
	rm -f "$DESTDIR/etc/config/qinglong-edge" "$DESTDIR/etc/config/qinglong-edge-opkg"
	rm -rf "$DESTDIR/etc/qinglong-edge" "$DESTDIR/var/lib/qinglong-edge"
fi

if [ "$live" = 1 ]; then
	case "$target" in
	openwrt) [ ! -x /etc/init.d/cron ] || /etc/init.d/cron restart || true ;;
	systemd) systemctl daemon-reload ;;
	esac
fi
echo "$me: removed qinglong-edge ($target)"
