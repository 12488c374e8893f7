"""``python -m torch_jax.report <command>``: command-line reports about the jax device.

Commands:
    coverage   which ops run natively, fall back to the CPU, or fail, per dtype
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "coverage":
        from torch_jax.report import _coverage

        return _coverage.main(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
