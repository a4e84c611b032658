"""``python -m distrl`` is the ``distrl`` command."""

import sys

from distrl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
