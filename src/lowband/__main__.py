import signal
import sys

from lowband.errors import INTERRUPTED

try:  # Ctrl-C while the command's modules import (torch takes seconds): one line, as at any later moment
    from lowband.cli import main
except KeyboardInterrupt:
    sys.stderr.write("lowband: interrupted\n")
    raise SystemExit(INTERRUPTED) from None

code = main()
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C while the interpreter exits: nothing left to stop
raise SystemExit(code)
