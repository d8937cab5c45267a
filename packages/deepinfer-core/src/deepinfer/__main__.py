from __future__ import annotations

import sys

from deepinfer.cli import main

sys.exit(main())
