import sys

from inference.lmi.cli import main

sys.exit(main())
