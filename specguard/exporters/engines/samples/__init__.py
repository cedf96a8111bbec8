"""Real captured pages shipped with the package (``specguard inspect --sample``)."""
