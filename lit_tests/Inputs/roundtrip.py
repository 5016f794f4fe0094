"""Read topos IR on stdin, rebuild the spec, emit it again, and say whether the text is identical.

Prints the rebuilt network's describe() lines, then `identical` or `DIFFERENT`.
"""

import sys

from topos.dialect import emit_text, parse_spec

text = sys.stdin.read()
network, roots, observes = parse_spec(text)
print(network.describe())
print("identical" if emit_text(network, roots, observes) == text else "DIFFERENT")
