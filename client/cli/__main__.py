"""``python -m codedgd.client.cli ...``: the `codedgd` command."""

import sys

from codedgd.client.cli import main

sys.exit(main())
