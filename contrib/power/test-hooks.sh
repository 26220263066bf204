#!/usr/bin/env bash
# Runs every power hook in this directory against a fake `stela` and checks which command each
# one sent, its exit status, and that it logged. Needs no UPS, no daemon and no running systemd.
#
# Usage: contrib/power/test-hooks.sh        (exit status 0 when every check passed)

set -eu

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bin=$work/bin
mkdir "$bin"

# The fake stela appends "ARGS|SOCKET" to a file (SOCKET: $STELA_SOCKET as it saw it) and exits
# with $FAKE_STELA_STATUS.
cat >"$bin/stela" <<'FAKE'
#!/bin/sh
printf '%s|%s\n' "$*" "${STELA_SOCKET-default}" >>"$FAKE_STELA_CALLS"
exit "${FAKE_STELA_STATUS:-0}"
FAKE
# The fake logger keeps the machine's syslog clean and lets the checks see what was logged.
cat >"$bin/logger" <<'FAKE'
#!/bin/sh
printf '%s\n' "$*" >>"$FAKE_LOGGER_LINES"
FAKE
chmod +x "$bin/stela" "$bin/logger"

export FAKE_STELA_CALLS=$work/calls FAKE_LOGGER_LINES=$work/logged
export STELA=$bin/stela PATH=$bin:$PATH
unset NOTIFYTYPE UPSNAME STELA_SOCKET FAKE_STELA_STATUS

passed=0
failed=0

# check NAME WANT_STATUS WANT_CALLS COMMAND...: runs COMMAND and compares its exit status and
# the fake stela's calls ("" for none) with the wanted ones. Every path of every hook logs, so
# an empty log fails the check as well.
check() {
    local name=$1 want_status=$2 want_calls=$3
    shift 3
    : >"$FAKE_STELA_CALLS"
    : >"$FAKE_LOGGER_LINES"
    local status=0
    "$@" >"$work/output" 2>&1 || status=$?
    local calls
    calls=$(cat "$FAKE_STELA_CALLS")
    if [[ $status == "$want_status" && $calls == "$want_calls" && -s $FAKE_LOGGER_LINES ]]; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
        echo "     exit status $status (wanted $want_status)"
        echo "     stela calls: '${calls//$'\n'/; }' (wanted '$want_calls')"
        echo "     logged: $(tr '\n' ';' <"$FAKE_LOGGER_LINES")"
        sed 's/^/     output: /' "$work/output"
    fi
}

# pass NAME COMMAND...: a check that is only a command succeeding.
pass() {
    local name=$1
    shift
    if "$@" >"$work/output" 2>&1; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
        sed 's/^/     output: /' "$work/output"
    fi
}

nut=$here/nut-notify.sh
msg="UPS ups@localhost on battery"

check "nut ONBATT sends power-fail" 0 "power-fail|default" \
    env NOTIFYTYPE=ONBATT UPSNAME=ups@localhost "$nut" "$msg"
check "nut LOWBATT sends power-fail" 0 "power-fail|default" env NOTIFYTYPE=LOWBATT "$nut" "$msg"
check "nut FSD sends power-fail" 0 "power-fail|default" env NOTIFYTYPE=FSD "$nut" "$msg"
check "nut ONLINE sends power-restore" 0 "power-restore|default" env NOTIFYTYPE=ONLINE "$nut" "$msg"
check "nut COMMBAD sends nothing" 0 "" env NOTIFYTYPE=COMMBAD "$nut" "$msg"
check "nut without NOTIFYTYPE sends nothing and fails" 2 "" "$nut" test
check "nut passes stela's failure on" 3 "power-fail|default" \
    env NOTIFYTYPE=ONBATT FAKE_STELA_STATUS=3 "$nut" "$msg"
check "nut leaves STELA_SOCKET to stela" 0 "power-fail|/tmp/other.sock" \
    env NOTIFYTYPE=ONBATT STELA_SOCKET=/tmp/other.sock "$nut" "$msg"
check "nut finds stela on PATH without STELA" 0 "power-restore|default" \
    env -u STELA NOTIFYTYPE=ONLINE "$nut" "$msg"

on=$here/apcupsd-onbattery
off=$here/apcupsd-offbattery
check "apcupsd onbattery sends power-fail" 0 "power-fail|default" "$on" ups0 1 0
check "apcupsd offbattery sends power-restore" 0 "power-restore|default" "$off" ups0 1 0
# 99 would tell apccontrol to skip its default action; a failure must not turn into that.
check "apcupsd onbattery failure exits 1, never 99" 1 "power-fail|default" \
    env FAKE_STELA_STATUS=99 "$on" ups0 1 0
check "apcupsd offbattery failure exits 1, never 99" 1 "power-restore|default" \
    env FAKE_STELA_STATUS=99 "$off" ups0 1 0
check "apcupsd onbattery without arguments" 0 "power-fail|default" "$on"

# The systemd unit's command, run as systemd would run it but with the fake binary.
unit=$here/stela-power-fail.service
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
read -ra argv <<<"${exec_line//\/usr\/bin\/stela/$bin/stela}"
run_unit_command() {
    "${argv[@]}"
    logger -t stela -- "unit ran" # the unit itself does not log; systemd's journal does
}
check "stela-power-fail.service runs stela power-fail" 0 "power-fail|default" run_unit_command
pass "stela-power-fail.service is wanted by sigpwr.target" \
    grep -qx 'WantedBy=sigpwr.target' "$unit"
pass "stela-power-fail.service is Type=oneshot" grep -qx 'Type=oneshot' "$unit"
pass "stela.service serves /var/lib/stela on /run/stela/stela.sock" grep -q \
    '^ExecStart=/usr/bin/stela serve --dir /var/lib/stela --socket /run/stela/stela.sock' \
    "$here/../systemd/stela.service"

if command -v systemd-analyze >/dev/null; then
    mkdir "$work/units"
    for u in stela.service stela-power-fail.service; do
        src=$here/$u
        [ -f "$src" ] || src=$here/../systemd/$u
        sed "s#/usr/bin/stela#$bin/stela#" "$src" >"$work/units/$u"
    done
    pass "systemd-analyze verify accepts both units" systemd-analyze verify \
        "$work/units/stela.service" "$work/units/stela-power-fail.service"
else
    echo "skip systemd-analyze verify (not installed)"
fi

if command -v shellcheck >/dev/null; then
    pass "shellcheck" shellcheck "$nut" "$on" "$off" "$here/test-hooks.sh"
else
    echo "skip shellcheck (not installed)"
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
