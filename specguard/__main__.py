import sys

from specguard.monitor.cli import main

sys.exit(main())
