"""`python -m b70bench.patches ACTION`: asv's install/uninstall commands run this, without torch."""

from b70bench.patches.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
