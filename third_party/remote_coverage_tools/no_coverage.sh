#!/bin/sh
# Stands in for Bazel's coverage tools, which this offline build does not ship.
# Must fail loudly: a silent success would report coverage that was never merged.
echo "devio: 'bazel coverage' is not supported by this offline build (no coverage tools)" >&2
exit 1
