"""`python -m harness.router`, the module path the README, the tests and the serving runner start
the router by: the router itself is harness/serving/router.py."""

import sys

from harness.serving.router import main

if __name__ == "__main__":
    sys.exit(main())
