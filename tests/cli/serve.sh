#!/usr/bin/env bash
# serve.sh: hearth serve end to end (tests/cli/serve_test.py: HTTP, streaming, the prompt
# cache across turns, parallel slots against solo runs, bad input, the key, the queue, SIGTERM).
cd "$(dirname "$0")/../.."
exec python3 tests/cli/serve_test.py
