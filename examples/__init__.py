"""Example projects that use Ductor from the outside (each its own project, on its own path)."""
