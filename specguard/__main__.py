import sys

from specguard.cli import main

sys.exit(main())
