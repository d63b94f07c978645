"""distlab.adaptive."""
