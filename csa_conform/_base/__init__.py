"""Plumbing every layer may use and none owns: atomic writes, bounded JSON, memory limits, terminal
quoting, case globs, shards, packaged resources and the verdict vocabulary. Nothing here knows CSA."""
