#!/bin/sh
# install.sh: install qinglong-edge from this tarball, without a package manager.
#
# For OpenWrt 25.x (apk: the .ipk does not install there), older OpenWrt, and any
# Linux with Python >= 3.11. Installs the same files as the .ipk, creates the
# `qinglong` user itself (uid/gid 5700 when free, as Require-User asks on OpenWrt)
# and runs the .ipk's own postinst logic (scripts/postinst-pkg).
#
# usage: ./install.sh [--target openwrt|systemd|plain] [--prefix DIR]
#                     [--destdir DIR] [--python PATH] [--no-start]
#   --target    openwrt: procd init script, UCI config, busybox crontab;
#               systemd: qinglong-edge.service + qinglong-edge-pull.timer;
#               plain:   the code and the launcher only.
#               Default: openwrt if <destdir>/etc/openwrt_release exists, systemd
#               if systemd runs this system, else plain.
#   --prefix    bin/ and lib/qinglong-edge/ go below it (default: /usr for
#               openwrt, /usr/local otherwise).
#   --destdir   stage into this root (also $DESTDIR): nothing outside it is
#               touched, no service is started, the user is added to its
#               etc/passwd and etc/group.
#   --python    the Python >= 3.11 interpreter (default /usr/bin/python3).
#   --no-start  do not enable or start the OpenWrt service.
# Running it again upgrades in place; configuration files you changed are kept and
# the new default is written beside them as FILE-opkg (as opkg does).
# Exit status: 0 installed, 64 usage, 1 failure. Remove with uninstall.sh (also
# copied to <prefix>/lib/qinglong-edge/).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
me=install.sh
die() { echo "$me: $*" >&2; exit 1; }
usage() { sed -n '2,30p' "$here/$me" | sed -n '/^#/s/^# \{0,1\}//p'; }
bad_usage() { echo "$me: $*" >&2; usage >&2; exit 64; }
# Paths end up in sed replacements and file names: keep them plain.
plain_path() {
	case "$1" in /*) ;; *) return 1 ;; esac
	case "$1" in *[!A-Za-z0-9/._+-]*) return 1 ;; esac
}

target=auto prefix= python=/usr/bin/python3 start=1
DESTDIR=${DESTDIR:-}
while [ $# -gt 0 ]; do
	case "$1" in
	--target | --prefix | --destdir | --python)
		[ $# -ge 2 ] || bad_usage "$1 needs a value"
		opt=${1#--}
		val=$2
		shift 2
		;;
	--target=* | --prefix=* | --destdir=* | --python=*)
		opt=${1%%=*}
		opt=${opt#--}
		val=${1#*=}
		shift
		;;
	--no-start) start=0; shift; continue ;;
	-h | --help) usage; exit 0 ;;
	*) bad_usage "unknown argument: $1" ;;
	esac
	case "$opt" in
	target) target=$val ;;
	prefix) prefix=$val ;;
	destdir) DESTDIR=$val ;;
	python) python=$val ;;
	esac
done

if [ -n "$DESTDIR" ]; then
	plain_path "$DESTDIR" || bad_usage "--destdir must be an absolute path of [A-Za-z0-9/._+-]"
	DESTDIR=${DESTDIR%/}
	[ -d "$DESTDIR" ] || die "$DESTDIR is not a directory"
	live=0
else
	live=1
fi
if [ "$target" = auto ]; then
	if [ -f "$DESTDIR/etc/openwrt_release" ]; then
		target=openwrt
	elif [ "$live" = 1 ] && [ -d /run/systemd/system ]; then
		target=systemd
	else
		target=plain
	fi
fi
case "$target" in openwrt | systemd | plain) ;; *) bad_usage "unknown target: $target" ;; esac
if [ -z "$prefix" ]; then
	if [ "$target" = openwrt ]; then prefix=/usr; else prefix=/usr/local; fi
fi
plain_path "$prefix" || bad_usage "--prefix must be an absolute path of [A-Za-z0-9/._+-]"
plain_path "$python" || bad_usage "--python must be an absolute path of [A-Za-z0-9/._+-]"
prefix=${prefix%/}
bindir=$prefix/bin
libdir=$prefix/lib/qinglong-edge
version=$(cat "$here/VERSION")
[ -d "$here/payload/usr/lib/qinglong-edge" ] || die "run me from the unpacked tarball"

if [ "$live" = 1 ]; then
	[ "$(id -u)" = 0 ] || die "run as root (or stage with --destdir)"
	"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null ||
		die "$python is missing or older than 3.11 (OpenWrt: apk add python3-light python3-openssl python3-sqlite3 python3-urllib python3-logging python3-ctypes)"
fi
upgrade=0
[ -f "$DESTDIR$libdir/install.conf" ] && upgrade=1

# put SRC DEST MODE: write SRC to DESTDIR/DEST atomically (temp + rename), rewriting
# the default install paths to this install's.
put() {
	mkdir -p "$(dirname "$DESTDIR$2")"
	sed -e "s|/usr/local/bin/qinglong-edge|$bindir/qinglong-edge|g" \
		-e "s|/usr/bin/qinglong-edge|$bindir/qinglong-edge|g" \
		-e "s|/usr/lib/qinglong-edge|$libdir|g" \
		-e "s|/usr/bin/python3|$python|g" "$1" >"$DESTDIR$2.qle-new"
	chmod "$3" "$DESTDIR$2.qle-new"
	mv -f "$DESTDIR$2.qle-new" "$DESTDIR$2"
}

# put_conffile SRC DEST MODE: like put, but a file the operator changed is kept and
# the new default goes to DEST-opkg (opkg's conffile rule, packaging.md 1.6).
put_conffile() {
	if [ -f "$DESTDIR$2" ]; then
		put "$1" "$2-opkg" "$3"
		if cmp -s "$DESTDIR$2" "$DESTDIR$2-opkg"; then
			rm -f "$DESTDIR$2-opkg"
		else
			echo "$me: kept your $2; the new default is $2-opkg"
		fi
	else
		put "$1" "$2" "$3"
	fi
}

# free_id FILE PREFERRED: PREFERRED unless a line of FILE (passwd/group) uses it,
# else the first free id from 32768 (OpenWrt's user_add/group_add_next rule).
free_id() {
	id=$2
	if cut -d: -f3 "$1" | grep -qx "$id"; then
		id=32768
		while cut -d: -f3 "$1" | grep -qx "$id"; do id=$((id + 1)); done
	fi
	echo "$id"
}

add_user() {
	if [ "$live" = 1 ] && [ "$target" != openwrt ] && command -v useradd >/dev/null 2>&1; then
		id qinglong >/dev/null 2>&1 && return 0
		nologin=/usr/sbin/nologin
		[ -x "$nologin" ] || nologin=/bin/false
		useradd --system --user-group --home-dir /var/lib/qinglong-edge --no-create-home \
			--shell "$nologin" qinglong
		return 0
	fi
	etc=$DESTDIR/etc
	[ -f "$etc/passwd" ] && [ -f "$etc/group" ] || die "no $etc/passwd and $etc/group to add the qinglong user to"
	locked=0
	if [ "$live" = 1 ] && command -v lock >/dev/null 2>&1; then
		lock /var/lock/passwd && locked=1
	fi
	if ! grep -q '^qinglong:' "$etc/group"; then
		echo "qinglong:x:$(free_id "$etc/group" 5700):" >>"$etc/group"
	fi
	gid=$(grep '^qinglong:' "$etc/group" | cut -d: -f3)
	if ! grep -q '^qinglong:' "$etc/passwd"; then
		echo "qinglong:x:$(free_id "$etc/passwd" 5700):$gid:qinglong:/var/run/qinglong:/bin/false" >>"$etc/passwd"
		[ ! -f "$etc/shadow" ] || echo 'qinglong:*:0:0:99999:7:::' >>"$etc/shadow"
	fi
	[ "$locked" = 0 ] || lock -u /var/lock/passwd
}

# The group id of qinglong inside DESTDIR (numeric: the staging host may not know it).
qinglong_gid() {
	grep '^qinglong:' "$DESTDIR/etc/group" 2>/dev/null | cut -d: -f3
}

install_code() {
	new=$DESTDIR$libdir.qle-new
	rm -rf "$new"
	mkdir -p "$new"
	cp -R "$here/payload/usr/lib/qinglong-edge/." "$new/"
	put "$here/scripts/postinst-pkg" "$libdir.qle-new/postinst-pkg" 0755
	put "$here/scripts/prerm-pkg" "$libdir.qle-new/prerm-pkg" 0755
	put "$here/uninstall.sh" "$libdir.qle-new/uninstall.sh" 0755
	{
		echo "# written by install.sh $version; read by uninstall.sh"
		echo "QLE_TARGET=$target"
		echo "QLE_PREFIX=$prefix"
		echo "QLE_PYTHON=$python"
		echo "QLE_VERSION=$version"
	} >"$new/install.conf"
	chmod -R u=rwX,go=rX "$new"
	rm -rf "$DESTDIR$libdir"
	mv "$new" "$DESTDIR$libdir"
	put "$here/payload/usr/bin/qinglong-edge" "$bindir/qinglong-edge" 0755
}

install_openwrt() {
	put "$here/payload/etc/init.d/qinglong-edge" /etc/init.d/qinglong-edge 0755
	put_conffile "$here/payload/etc/config/qinglong-edge" /etc/config/qinglong-edge 0644
	put_conffile "$here/payload/etc/crontabs/qinglong" /etc/crontabs/qinglong 0600
	# busybox crond ignores a crontab not owned by uid 0.
	[ "$(id -u)" != 0 ] || chown 0:0 "$DESTDIR/etc/crontabs/qinglong"
	put "$here/payload/lib/upgrade/keep.d/qinglong-edge" /lib/upgrade/keep.d/qinglong-edge 0644
}

install_systemd() {
	for unit in qinglong-edge.service qinglong-edge-pull.service qinglong-edge-pull.timer; do
		put "$here/systemd/$unit" "/etc/systemd/system/$unit" 0644
	done
	mkdir -p "$DESTDIR/etc/qinglong-edge"
	chmod 0750 "$DESTDIR/etc/qinglong-edge"
	[ -f "$DESTDIR/etc/qinglong-edge/config.json" ] ||
		put "$here/systemd/config.json" /etc/qinglong-edge/config.json 0640
	if [ "$(id -u)" = 0 ]; then
		gid=$(qinglong_gid)
		if [ -z "$gid" ] && [ "$live" = 1 ]; then gid=$(id -g qinglong); fi
		[ -z "$gid" ] || chown "0:$gid" "$DESTDIR/etc/qinglong-edge" "$DESTDIR/etc/qinglong-edge/config.json"
	fi
}

run_postinst() {
	(
		IPKG_INSTROOT=$DESTDIR
		PKG_UPGRADE=$upgrade
		QLE_LIBDIR=$DESTDIR$libdir
		QLE_PYTHON=$python
		if [ "$target" = openwrt ]; then QLE_CRON_INIT=/etc/init.d/cron; else QLE_CRON_INIT=; fi
		export IPKG_INSTROOT PKG_UPGRADE QLE_LIBDIR QLE_PYTHON QLE_CRON_INIT
		. "$DESTDIR$libdir/postinst-pkg"
	)
}

# An upgrade with a resident pull: it imports code lazily, so it must not run on while
# the code is replaced. Stopped with SIGTERM alone, it persists and exits; its jobs go on
# (their 30 s leases run on) and the pull started after the install re-adopts them at
# once. OpenWrt: the old prerm-pkg's `pull --release` (after switching cron's pull off),
# the service's stop; its start after the install runs one pull at once. systemd: the
# pull unit is stopped, and started again (at once, not at the next timer minute).
pull_was_active=0
if [ "$live" = 1 ] && [ "$upgrade" = 1 ]; then
	case "$target" in
	openwrt)
		if [ -f "$DESTDIR$libdir/prerm-pkg" ]; then
			(
				PKG_UPGRADE=1
				QLE_LIBDIR=$DESTDIR$libdir
				QLE_BIN=$bindir/qinglong-edge
				export PKG_UPGRADE QLE_LIBDIR QLE_BIN
				. "$DESTDIR$libdir/prerm-pkg"
			) || true
		fi
		[ ! -x /etc/init.d/qinglong-edge ] || /etc/init.d/qinglong-edge stop || true
		;;
	systemd)
		if systemctl is-active --quiet qinglong-edge-pull.service 2>/dev/null; then
			pull_was_active=1
			systemctl stop qinglong-edge-pull.service || true
		fi
		;;
	esac
fi
[ "$target" = plain ] || add_user
install_code
case "$target" in
openwrt) install_openwrt ;;
systemd) install_systemd ;;
esac
run_postinst

if [ "$live" = 1 ]; then
	case "$target" in
	openwrt)
		if [ "$start" = 1 ]; then
			# default_postinst's rule: enable on first install only, start always.
			[ "$upgrade" = 1 ] || /etc/init.d/qinglong-edge enable
			/etc/init.d/qinglong-edge start
		fi
		echo "$me: installed qinglong-edge $version; configure /etc/config/qinglong-edge, then" \
			"uci commit qinglong-edge; reload_config"
		;;
	systemd)
		systemctl daemon-reload
		[ "$upgrade" = 0 ] || systemctl try-restart qinglong-edge.service
		# The stopped resident pull's successor, now (as user qinglong: the unit's User=).
		[ "$pull_was_active" = 0 ] || systemctl start --no-block qinglong-edge-pull.service
		echo "$me: installed qinglong-edge $version; edit /etc/qinglong-edge/config.json, then" \
			"systemctl enable --now qinglong-edge-pull.timer (worker) and/or qinglong-edge.service (Local API)"
		;;
	plain) echo "$me: installed qinglong-edge $version as $bindir/qinglong-edge" ;;
	esac
else
	echo "$me: staged qinglong-edge $version ($target) into $DESTDIR"
fi
