"""``dit-models``: parameters and multiply-adds of the 12 DiT configurations, beside the published figures.

    dit-models [--image-size 256]
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dit-models", description=__doc__.splitlines()[0].strip("`: "))
    parser.add_argument("--image-size", type=int, default=256, help="image side in pixels (latents are 1/8)")
    args = parser.parse_args(argv)
    from dit_core.measure.flops import config_table, format_table

    print(format_table(config_table(args.image_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
