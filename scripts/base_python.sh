#!/bin/sh
# Prints the interpreter `make install` builds .venv/ from (the Makefile's PYTHON; `make
# PYTHON=...` overrides it).
#
# The distribution's CPython 3.11 where the machine has one that can make a virtualenv
# (/usr/bin/python3.11 with ensurepip: Debian's python3.11-venv), else `python3` from PATH.
# Why: the pinned wheels are CPython 3.11's, and Debian builds its interpreter with
# profile-guided optimisation and LTO and links the executable statically, where a python3
# built from source without --enable-optimizations (pyenv's default, this machine's PATH) has
# neither and goes through libpython's PLT. Measured on one 2-vCPU AMD EPYC, side by side
# (benchmarks/README.md, round frontdoor15): a pure-Python loop took 49 ms against 69-75 ms;
# the API process used 0.914 of the CPU per short request and 0.854 per 64-token stream
# (benchmarks.gateway_ab), and benchmarks.gateway's cpu_ms_per_request was 0.86-0.94 against
# 1.25-1.56. The official python:3.11 images (deploy/Dockerfile) are built with
# --enable-optimizations --with-lto already.
#
# BASE_PYTHON_CANDIDATE names another distribution interpreter to prefer (the tests use it).
set -eu
candidate=${BASE_PYTHON_CANDIDATE:-/usr/bin/python3.11}
if [ -x "$candidate" ] && "$candidate" -c "import ensurepip, venv" >/dev/null 2>&1; then
    echo "$candidate"
else
    echo python3
fi
