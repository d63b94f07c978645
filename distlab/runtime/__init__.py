"""distlab.runtime."""
