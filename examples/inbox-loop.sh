#!/bin/sh
# Wake an agent from a plain shell loop: one JSON wake-up per line, acknowledged by
# bgtask after it was printed. Replace the body of the loop with your runtime's call.
set -eu
target=${1:-default}
bgtask inbox --target "$target" --follow --json | while IFS= read -r wakeup; do
  id=$(printf '%s' "$wakeup" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
  status=$(printf '%s' "$wakeup" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')
  echo "task $id $status"
  # your-agent --resume "$session" <<< "$(printf '%s' "$wakeup" | python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt"])')"
done
