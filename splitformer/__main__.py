"""``python -m splitformer``: the same command line as the ``splitformer`` script."""

import sys

from splitformer.codegen.cli import main

if __name__ == "__main__":
    sys.exit(main())
