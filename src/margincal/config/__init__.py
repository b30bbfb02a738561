"""The ground layer's settings: typed builds from mappings, the settings files, the typed configs and their one
resolution."""
