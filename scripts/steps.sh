# Sourced by the set-up scripts: long steps say what they do, how long that usually takes, and that
# they are still going (a line every 10 s while they run), so a first run is never a silent wait.

step_say() { printf '%s %s\n' "[$(date +%H:%M:%S)]" "$*" >&2; }

# _tick WHAT STARTED: every 10 s, "still going". Its sleep dies with it, so no pipe is held open after.
_tick() {
  local what=$1 started=$2 nap=""
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep 10 & nap=$!
    wait "$nap"
    step_say "    ... $what: $(( $(date +%s) - started )) s so far"
  done
}

# step DESCRIPTION USUALLY CMD...: runs CMD with its output, a heartbeat while it runs, and the time.
step() {
  local what=$1 usually=$2; shift 2
  local started rc ticker
  started=$(date +%s)
  step_say "==> $what (usually $usually)"
  _tick "$what" "$started" &
  ticker=$!
  rc=0
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  if [ "$rc" = 0 ]; then
    step_say "    done: $what in $(( $(date +%s) - started )) s"
  else
    step_say "    FAILED ($rc): $what after $(( $(date +%s) - started )) s"
  fi
  return "$rc"
}

# pip_in VENV ARGS...: pip with one line per package it collects or installs (its progress), minus
# the notices this machine's extra (empty) package indexes and setuptools' editable build print.
pip_in() {
  local venv=$1; shift
  "$venv/bin/python" -m pip "$@" --progress-bar off --disable-pip-version-check 2>&1 \
    | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully|ERROR|error:)' || true; } \
    | sed -u -e 's/^/    /' -e 's/^\(    Installing collected packages:\).\{80,\}/\1 (many: this takes a while)/'
  return "${PIPESTATUS[0]}"
}

# apt_install PACKAGES...: Debian packages, one line per package fetched, unpacked and set up.
apt_install() {
  apt-get -q update | sed -u -n -e 's/^/    /' -e '/^    \(Get:\|Reading package lists\)/p'
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || return "$rc"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
    | sed -u -n -e 's/^/    /' -e '/^    \(Get:\|Unpacking\|Setting up\)/p'
  return "${PIPESTATUS[0]}"
}
