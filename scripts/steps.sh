# Sourced by the set-up scripts: long steps say what they do, how long that usually takes, and that
# they are still going (a line every 30 s of silence), so a first run is never a silent wait.

step_say() { printf '%s %s\n' "[$(date +%H:%M:%S)]" "$*" >&2; }

# step DESCRIPTION USUALLY CMD...: runs CMD with its output, a heartbeat while it is quiet, and the time.
step() {
  local what=$1 usually=$2; shift 2
  local started rc ticker
  started=$(date +%s)
  step_say "==> $what (usually $usually)"
  ( while sleep 30; do step_say "    ... $what: $(( $(date +%s) - started )) s so far"; done ) &
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
    | grep --line-buffered -E '^(Collecting|Installing collected|Successfully|ERROR|error:)' \
    | sed -u -e 's/^/    /' -e 's/^\(    Installing collected packages:\).\{80,\}/\1 (many: this takes a while)/'
  return "${PIPESTATUS[0]}"
}
