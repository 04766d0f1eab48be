"""`python -m xr_jepsen`: the `xr-jepsen` command line."""

import sys

from xr_jepsen.cli import main

sys.exit(main())
