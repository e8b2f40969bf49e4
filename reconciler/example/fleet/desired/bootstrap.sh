#!/bin/sh
# Example bootstrap: runs once per box (and again when this file changes). Must be quick and offline here;
# a real one would create a venv and install the project's dependencies.
set -eu
mkdir -p "$HOME/rigsync/env"
python3 --version > "$HOME/rigsync/env/python-version" 2>&1 || true
date -u +%Y-%m-%dT%H:%M:%SZ > "$HOME/rigsync/env/ready"
echo "bootstrap done on $(uname -n)"
