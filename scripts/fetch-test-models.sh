#!/usr/bin/env bash
# Placeholder until the real script lands: says what it would do.
echo "fetch-test-models: not implemented yet (models/ stays empty)"
