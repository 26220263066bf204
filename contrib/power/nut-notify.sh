#!/bin/sh
# NOTIFYCMD hook for NUT's upsmon: tells the stela log daemon when the mains go and come back.
#
# upsmon starts this once for every event whose NOTIFYFLAG includes EXEC. The human-readable
# message arrives as the single argument, the kind of event in $NOTIFYTYPE and the UPS in
# $UPSNAME. It runs as upsmon's RUN_AS_USER (often "nut"), so that user must be allowed to
# connect to the daemon's socket.
#
#   ONBATT, LOWBATT, FSD  ->  stela power-fail      (buffers go to disk now, while there is power)
#   ONLINE                ->  stela power-restore
#   any other event       ->  logged, nothing sent
#
# From power-fail until power-restore the daemon refuses appends. One outage can send power-fail
# more than once (ONBATT, then LOWBATT, then FSD); a repeat is harmless.
#
# upsmon.conf, with this file installed as /usr/local/lib/stela/nut-notify.sh:
#
#   NOTIFYCMD /usr/local/lib/stela/nut-notify.sh
#   NOTIFYFLAG ONBATT  SYSLOG+EXEC
#   NOTIFYFLAG ONLINE  SYSLOG+EXEC
#   NOTIFYFLAG LOWBATT SYSLOG+EXEC
#   NOTIFYFLAG FSD     SYSLOG+EXEC
#
# (add +WALL to a flag to also tell logged-in users). upsmon has a single NOTIFYCMD: if another
# script already has that slot, call this one from it with the same argument and environment.
#
# Environment:
#   STELA         the stela binary (default: "stela" from PATH)
#   STELA_SOCKET  read by stela itself; when unset it talks to /run/stela/stela.sock

set -eu

# upsmon may start us with a bare environment.
PATH="${PATH:-/usr/bin:/bin}:/usr/local/bin:/usr/bin:/bin"
export PATH

stela=${STELA:-stela}
event=${NOTIFYTYPE:-}
message=${1:-}
ups=${UPSNAME:-the UPS}

log() {
    # No syslog (a container, early boot) must not keep the daemon from being told.
    logger -t stela -- "$*" 2>/dev/null || true
}

case $event in
    ONBATT | LOWBATT | FSD) action=power-fail ;;
    ONLINE) action=power-restore ;;
    "")
        log "nut-notify: started without NOTIFYTYPE, nothing sent (message: $message)"
        echo "nut-notify: NOTIFYTYPE is not set; this script is meant for upsmon's NOTIFYCMD" >&2
        exit 2
        ;;
    *)
        log "nut-notify: $event from $ups needs nothing from stela ($message)"
        exit 0
        ;;
esac

if "$stela" "$action"; then
    log "nut-notify: $event from $ups: sent stela $action ($message)"
else
    status=$?
    log "nut-notify: $event from $ups: stela $action failed with exit status $status"
    exit "$status"
fi
