"""distlab.costmodel."""
