"""The ground layer: errors, the one registry kind, the checked door for a user's files, atomic files and digests, the
quiet terminal."""
