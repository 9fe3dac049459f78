"""The package version, in a leaf module so that any layer can name it cheaply."""

__version__ = "0.2.0"
