#!/usr/bin/env bash
# The router's surfaces from the command line. BASE defaults to a local speclane.
set -euo pipefail
BASE="${BASE:-http://127.0.0.1:8080}"
MODEL="${MODEL:-SmolLM2-135M-Instruct}"

echo "== models";  curl -s "$BASE/v1/models"; echo
echo "== a chat request, with the routing headers (-D -)"
curl -s -D - "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -H 'X-Speclane-Preset: interactive' \
  -d "{\"model\": \"$MODEL\", \"max_tokens\": 24, \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}"
echo; echo "== force the batching lane, streamed"
curl -sN "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -H 'X-Speclane-Lane: batching' \
  -d "{\"model\": \"$MODEL\", \"max_tokens\": 16, \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"Count to five.\"}]}"
echo "== lanes and backends";  curl -s "$BASE/admin/lanes"; echo
echo "== speculative state per workload";  curl -s "$BASE/admin/spec"; echo
echo "== speculative metrics"; curl -s "$BASE/metrics" | grep '^speclane_spec_' || true
