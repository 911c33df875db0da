"""``python -m splitformer``: the same command line as the ``splitformer`` script."""

from splitformer.codegen.cli import console

if __name__ == "__main__":
    console()
