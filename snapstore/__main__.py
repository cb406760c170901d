"""``python -m snapstore``: the same command line as the ``snapstore`` console script."""
import sys

from snapstore.cli import main

if __name__ == "__main__":
    sys.exit(main())
