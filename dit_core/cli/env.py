"""``dit-env``: print what this machine offers for DiT training and the profile to start from.

    dit-env [--json] [--no-probe]
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dit-env", description="environment report for DiT training")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-probe", action="store_true", help="skip running the attention kernels")
    args = parser.parse_args(argv)

    from dit_core.measure.env import environment_report, format_report

    report = environment_report(probe_attention=not args.no_probe)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
