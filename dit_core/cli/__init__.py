"""Command-line entry points (installed as console scripts by pyproject.toml).

Each module holds one command's ``main(argv=None)``, a thin argparse layer over the library function
that does the work, so everything a command does can also be called from Python.
"""
