"""distlab.notebook."""
