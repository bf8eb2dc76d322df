"""The provider matrix's shared modules (``provider_cases``, ``provider_surfaces``) are
imported by name, as ``render_providers.py`` imports them when run as a script."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
