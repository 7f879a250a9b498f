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
echo "== Anthropic Messages, streamed (the Anthropic front door)"
curl -sN "$BASE/v1/messages" -H 'Content-Type: application/json' -H 'x-api-key: local' \
  -H 'anthropic-version: 2023-06-01' \
  -d "{\"model\": \"$MODEL\", \"max_tokens\": 16, \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}"
echo "== its token count, with the lanes' tokenizer"
curl -s "$BASE/v1/messages/count_tokens" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}"
echo; echo "== Ollama chat, NDJSON (the Ollama front door)"
curl -sN "$BASE/api/chat" \
  -d "{\"model\": \"$MODEL\", \"options\": {\"num_predict\": 16}, \"messages\": [{\"role\": \"user\", \"content\": \"Count to five.\"}]}"
echo "== Ollama's model list";  curl -s "$BASE/api/tags"; echo
echo "== lanes and backends";  curl -s "$BASE/admin/lanes"; echo
echo "== speculative state per workload";  curl -s "$BASE/admin/spec"; echo
echo "== speculative metrics"; curl -s "$BASE/metrics" | grep '^speclane_spec_' || true
