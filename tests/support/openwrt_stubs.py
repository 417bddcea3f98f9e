"""Stubs of the OpenWrt shell environment for running our maintainer and init scripts.

No OpenWrt root can run here, so these are fakes, faithful to the documented
behaviour of base-files' ``/lib/functions.sh`` (packaging.md 1.8) and of
``/etc/rc.common`` + ``procd.sh`` (packaging.md 4.1), and they say so:

* :data:`FUNCTIONS_SH` -> ``<root>/lib/functions.sh``: ``default_postinst``,
  ``default_prerm``, ``add_group_and_user`` (reads ``Require-User:`` from
  ``<root>/usr/lib/opkg/info/<pkg>.control``, appends to ``<root>/etc/passwd``,
  ``group``, ``shadow``), and the UCI shell API the init script uses (``config_load``
  sources ``<root>/etc/config/<name>``; ``config_get``, ``config_get_bool``,
  ``config_foreach``). Every file the stub touches is below ``$QLE_STUB_ROOT`` even
  when ``IPKG_INSTROOT`` is empty (the "live device" case), and calls that would act
  on a running system (``/etc/init.d/* enable|start|stop|disable``, ``rc.common``)
  are appended to ``$QLE_STUB_LOG`` instead of run.
* :data:`PROCD_SH`: ``procd_open_instance``, ``procd_set_param``,
  ``procd_close_instance``, ``procd_add_reload_trigger``, ``logger`` and ``chown``
  (no ``qinglong`` user exists on the test host), all recording to the log.
"""

from __future__ import annotations

import pathlib

__all__ = ["FUNCTIONS_SH", "PROCD_SH", "make_root", "read_log", "write_logging_stub"]

FUNCTIONS_SH = r'''# STUB of OpenWrt's /lib/functions.sh for tests (tests/support/openwrt_stubs.py).
qle_stub_log() { echo "$*" >> "${QLE_STUB_LOG:?}"; }

add_group_and_user() {
	local pkgname="$1" rusers tuple uname gname uid gid sroot="${QLE_STUB_ROOT:?}"
	rusers="$(sed -ne 's/^Require-User: *//p' "$sroot/usr/lib/opkg/info/$pkgname.control" 2>/dev/null)"
	for tuple in $rusers; do
		uname=${tuple%%:*}
		gname=${tuple#*:}
		uid=${uname#*=}
		uname=${uname%%=*}
		gid=${gname#*=}
		gname=${gname%%=*}
		grep -qs "^$gname:" "$sroot/etc/group" || echo "$gname:x:$gid:" >> "$sroot/etc/group"
		if ! grep -qs "^$uname:" "$sroot/etc/passwd"; then
			echo "$uname:x:$uid:$gid:$uname:/var/run/$uname:/bin/false" >> "$sroot/etc/passwd"
			echo "$uname:x:0:0:99999:7:::" >> "$sroot/etc/shadow"
		fi
		qle_stub_log "add_group_and_user $uname=$uid $gname=$gid"
	done
}

default_postinst() {
	local root="${IPKG_INSTROOT}" sroot="${QLE_STUB_ROOT:?}" ret=0 i
	[ -z "$pkgname" ] && local pkgname="$(basename ${1%.*})"
	local filelist="$sroot/usr/lib/opkg/info/${pkgname}.list"
	add_group_and_user "${pkgname}"
	if [ -f "$sroot/usr/lib/opkg/info/${pkgname}.postinst-pkg" ]; then
		( . "$sroot/usr/lib/opkg/info/${pkgname}.postinst-pkg" )
		ret=$?
	fi
	for i in $(grep -s "^/etc/init.d/" "$filelist"); do
		if [ -n "$root" ]; then
			qle_stub_log "rc.common $root$i enable"
		else
			[ "$PKG_UPGRADE" != "1" ] && qle_stub_log "$i enable"
			qle_stub_log "$i start"
		fi
	done
	return $ret
}

default_prerm() {
	local root="${IPKG_INSTROOT}" sroot="${QLE_STUB_ROOT:?}" ret=0 i
	[ -z "$pkgname" ] && local pkgname="$(basename ${1%.*})"
	local filelist="$sroot/usr/lib/opkg/info/${pkgname}.list"
	if [ -f "$sroot/usr/lib/opkg/info/${pkgname}.prerm-pkg" ]; then
		( . "$sroot/usr/lib/opkg/info/${pkgname}.prerm-pkg" )
		ret=$?
	fi
	for i in $(grep -s "^/etc/init.d/" "$filelist"); do
		if [ -n "$root" ]; then
			qle_stub_log "rc.common $root$i disable"
		else
			[ "$PKG_UPGRADE" != "1" ] && qle_stub_log "$i disable"
			qle_stub_log "$i stop"
		fi
	done
	return $ret
}

# UCI shell API (base-files functions.sh + uci.sh), reading <root>/etc/config/<name>.
config() {
	QLE_CFG_N=$((QLE_CFG_N + 1))
	QLE_CFG_SECTION="${2:-cfg$QLE_CFG_N}"
	QLE_CFG_SECTIONS="$QLE_CFG_SECTIONS $QLE_CFG_SECTION"
	eval "CONFIG_${QLE_CFG_SECTION}_TYPE=\$1"
}
option() { eval "CONFIG_${QLE_CFG_SECTION}_$1=\$2"; }
list() { eval "CONFIG_${QLE_CFG_SECTION}_$1=\"\${CONFIG_${QLE_CFG_SECTION}_$1:+\${CONFIG_${QLE_CFG_SECTION}_$1} }\$2\""; }
config_load() {
	QLE_CFG_SECTIONS=
	QLE_CFG_N=0
	. "${QLE_STUB_ROOT:?}/etc/config/$1"
}
config_get() { eval "$1=\"\${CONFIG_$2_$3:-\$4}\""; }
config_get_bool() {
	local _v
	config_get _v "$2" "$3" "$4"
	case "$_v" in
	1 | on | true | yes | enabled) _v=1 ;;
	0 | off | false | no | disabled) _v=0 ;;
	*) _v="$4" ;;
	esac
	eval "$1=\$_v"
}
config_foreach() {
	local _fn="$1" _type="$2" _s _t
	for _s in $QLE_CFG_SECTIONS; do
		eval "_t=\${CONFIG_${_s}_TYPE}"
		[ "$_t" = "$_type" ] && "$_fn" "$_s"
	done
	return 0
}
'''

PROCD_SH = r'''# STUB of procd.sh / rc.common for tests (tests/support/openwrt_stubs.py).
procd_open_instance() { qle_stub_log "procd_open_instance $*"; }
procd_set_param() { qle_stub_log "procd_set_param $*"; }
procd_close_instance() { qle_stub_log "procd_close_instance"; }
procd_add_reload_trigger() { qle_stub_log "procd_add_reload_trigger $*"; }
logger() { qle_stub_log "logger $*"; }
chown() { qle_stub_log "chown $*"; }
'''


def make_root(root: pathlib.Path) -> pathlib.Path:
    """A minimal OpenWrt-like root: passwd/group/shadow with root, the stub functions.sh."""
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/ash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "shadow").write_text("root::0:0:99999:7:::\n")
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib" / "functions.sh").write_text(FUNCTIONS_SH)
    return root


def write_logging_stub(path: pathlib.Path, log: pathlib.Path, name: str, then: str = "exit 0") -> pathlib.Path:
    """An executable that appends ``NAME ARGS`` to ``log``, then runs ``then`` (shell)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{then}\n')
    path.chmod(0o755)
    return path


def read_log(log: pathlib.Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []
