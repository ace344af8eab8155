"""Facts about the machine that benchmark scripts print next to their figures."""

from __future__ import annotations

import os


def load_average() -> str:
    """Background load matters on a 2-core machine (torch's OpenMP barriers wait for
    descheduled threads): print it with the figures."""
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"
