#!/bin/sh
# An exec sink that posts the wake-up's prompt (on stdin) to a Slack-style incoming
# webhook. The webhook URL is a secret: it comes from the server's environment, not
# from the spec, which the event stream keeps.
set -eu
: "${SLACK_WEBHOOK_URL:?set SLACK_WEBHOOK_URL in the environment of bgtask server}"
python3 -c 'import json, sys; print(json.dumps({"text": sys.stdin.read()}))' |
  curl --fail --silent --show-error --max-time 20 \
    -H 'Content-Type: application/json' -H "Idempotency-Key: $BGTASK_TASK_ID" \
    --data-binary @- "$SLACK_WEBHOOK_URL"
