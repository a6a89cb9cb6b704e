#!/usr/bin/env bash
# Posts the record of one finished GPU job to taskledger.
#
#   TASKLEDGER_URL=http://127.0.0.1:8080 TASKLEDGER_TOKEN=tl_... \
#     ./post-job-record.sh vision train-resnet-nightly-2026-11-20 H100 8 \
#       2026-11-20T10:00:00Z 2026-11-20T11:30:00Z completed
#
# The token is an ingest token of the project (`taskledger token create --role ingest
# --project vision`). Re-running the script with the same arguments is safe: taskledger
# counts the record as a duplicate. It exits non-zero, printing the problem document, when
# the record is refused.
set -euo pipefail

if [ "$#" -lt 7 ]; then
  echo "usage: $0 PROJECT TASK_ID GPU_MODEL GPU_COUNT STARTED_AT ENDED_AT OUTCOME [ATTEMPT]" >&2
  exit 2
fi
: "${TASKLEDGER_URL:=http://127.0.0.1:8080}"
: "${TASKLEDGER_TOKEN:?set TASKLEDGER_TOKEN to an ingest token}"

project=$1 task_id=$2 gpu_model=$3 gpu_count=$4 started_at=$5 ended_at=$6 outcome=$7
attempt=${8:-1}

body=$(cat <<JSON
[{"project": "$project", "task_id": "$task_id", "attempt": $attempt,
  "gpu_model": "$gpu_model", "gpu_count": "$gpu_count",
  "started_at": "$started_at", "ended_at": "$ended_at", "outcome": "$outcome",
  "labels": {"ci_run": "${GITHUB_RUN_ID:-local}"}}]
JSON
)

curl --silent --show-error --fail-with-body \
  --retry 5 --retry-all-errors --max-time 30 \
  -X POST "$TASKLEDGER_URL/v1/job-records" \
  -H "Authorization: Bearer $TASKLEDGER_TOKEN" \
  -H 'Content-Type: application/json' \
  --data "$body"
echo
