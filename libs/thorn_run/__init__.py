"""thorn-run: the whole controller on one machine (what `make run` starts)."""
