"""The package version (``snapstore.__version__``), in a leaf module so the tools below the
package's ``__init__`` (cli, bench) can report it without importing the package root."""

__version__ = "0.1.0"
