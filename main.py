"""Launch the gradscope GUI: ``python main.py [MODEL] [IMAGE]`` (no arguments: the bundled demo)."""

import sys

from gradscope.qt.app import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
