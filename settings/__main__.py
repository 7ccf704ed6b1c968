import sys

from settings.cli import main

sys.exit(main())
