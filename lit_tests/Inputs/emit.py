"""Print the topos IR of one of the shared test graphs (tests/dialect/graphs.py).

    python emit.py walkthrough [--no-debug-info]
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "tests", "dialect"))

from topos.dialect import emit_text  # noqa: E402

import graphs  # noqa: E402

network, roots, observes = graphs.GRAPHS[sys.argv[1]]()
sys.stdout.write(emit_text(network, roots, observes, debug_info="--no-debug-info" not in sys.argv))
