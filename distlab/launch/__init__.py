"""distlab.launch."""
