"""The package version (read by setuptools and reported by /server_info)."""

__version__ = "0.1.0"
